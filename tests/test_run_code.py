"""A run folder, or an export, carries a config that names its task; it must not be able
to choose code. A user's task module it names is imported only when this user ran `fit`
with that very file on this machine, or with --trust-run-code (registry.py)."""

import json
import sys

import pytest

from amptrain import api, registry
from amptrain.errors import ConfigError

# Imported, it leaves a file: the proof that a refused module did not run.
PLANTED = """
import pathlib
pathlib.Path(__file__).with_name("ran").write_text("the module ran")
from amptrain.tasks.classification import ClassificationTask as PlantedTask
"""


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """A run folder whose config names a module it carries (`task_path = "."`), never imported."""
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "planted_task.py").write_text(PLANTED)
    (run / "config.toml").write_text('task = "planted_task:PlantedTask"\ntask_path = "."\n')
    yield run
    sys.modules.pop("planted_task", None)
    sys.path[:] = [p for p in sys.path if p != str(run)]


def refusal(call):
    with pytest.raises(ConfigError) as raised:
        call()
    return str(raised.value)


def test_a_run_folder_does_not_run_the_code_it_carries(run_folder):
    for call in (
        lambda: api.predict(str(run_folder), ["a text"]),
        lambda: api.evaluate(str(run_folder)),
        lambda: api.export(str(run_folder)),
    ):
        message = refusal(call)
        assert message.startswith(f"{run_folder}: its config names the task 'planted_task:PlantedTask', code in ")
        assert "made elsewhere, or by an older amptrain" in message and message.endswith(
            "a folder's config does not choose what runs: pass --trust-run-code to import it if you trust it"
        )
        assert "\n" not in message and not (run_folder / "ran").exists() and "planted_task" not in sys.modules


def test_code_this_user_ran_fit_with_loads_and_a_change_to_it_is_refused(run_folder):
    search = [str(run_folder)]
    registry.task_class("planted_task:PlantedTask", search)  # as `fit` imports it, the user's choice
    record = registry.trust_task_code("planted_task:PlantedTask")
    assert record["file"] == str(run_folder / "planted_task.py") and len(record["sha256"]) == 64
    (run_folder / registry.CODE_RECORD_FILE).write_text(json.dumps(record))
    sys.modules.pop("planted_task")  # a new process: nothing imported yet
    (run_folder / "ran").unlink()
    registry.task_class("planted_task:PlantedTask", search, carried_by=str(run_folder))  # trusted: imported
    assert (run_folder / "ran").exists()
    sys.modules.pop("planted_task")
    (run_folder / "ran").unlink()
    (run_folder / "planted_task.py").write_text(PLANTED + "\n# changed\n")
    message = refusal(lambda: registry.task_class("planted_task:PlantedTask", search, carried_by=str(run_folder)))
    assert "that changed since `fit` ran it" in message and not (run_folder / "ran").exists()
    registry.task_class("planted_task:PlantedTask", search, carried_by=str(run_folder), trust=True)
    assert (run_folder / "ran").exists()  # --trust-run-code: the user said so


def test_a_module_moved_since_fit_is_named(run_folder, tmp_path):
    record = {"task": "planted_task:PlantedTask", "file": str(tmp_path / "elsewhere" / "planted_task.py")}
    (run_folder / registry.CODE_RECORD_FILE).write_text(json.dumps(record))
    message = refusal(lambda: api.predict(str(run_folder), ["a text"]))
    assert f"not where `fit` found it ({record['file']})" in message
    (run_folder / "planted_task.py").unlink()
    message = refusal(lambda: api.predict(str(run_folder), ["a text"]))
    assert f"whose module is not found (`fit` imported it from {record['file']})" in message


@pytest.mark.parametrize(
    "name, says",
    [
        (":PlantedTask", "expected one of"),
        ("../../etc/passwd:X", "dotted names"),
        ("amptrain.tasks.base:Task", "is abstract: it does not implement add_split, build_model"),
    ],
)
def test_a_bad_task_path_is_one_line(name, says):
    message = refusal(lambda: registry.task_class(name))
    assert says in message and "\n" not in message


def test_a_module_planted_beside_a_trusted_one_is_not_the_one_imported(run_folder, tmp_path):
    """The run folder's config points task_path at the module this user trained with, and
    carries a module of the same name itself: the trusted one is checked and imported."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "planted_task.py").write_text(PLANTED.replace('with_name("ran")', 'with_name("mine ran")'))
    registry.task_class("planted_task:PlantedTask", [str(mine)])  # `fit` with the user's own
    registry.trust_task_code("planted_task:PlantedTask")
    sys.modules.pop("planted_task")
    sys.path[:] = [p for p in sys.path if p != str(mine)]
    registry.task_class("planted_task:PlantedTask", [str(mine), str(run_folder)], carried_by=str(run_folder))
    assert (mine / "mine ran").exists() and not (run_folder / "ran").exists()
