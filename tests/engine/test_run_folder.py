"""A run folder that cannot be corrupted or misread: the lock, unique temporary
files, checked learned files, a half-written metrics line, a moved folder, streamed predict.

One tiny run is trained for the module; each test damages a copy of it."""

import io
import json
import os
import random
import shutil
import threading

import pytest
from conftest import assert_only_amptrains, write_tiny

import amptrain
from amptrain.cli import main
from amptrain.engine.run_folder.lock import LOCK_FILE, RunLock
from amptrain.engine.run_log import read_metrics
from amptrain.errors import UserError
from amptrain.files import atomic_write


def in_process(capsys, *args):
    capsys.readouterr()
    status = main(list(args))
    return status, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, spam_rows):
    """(folder with the tiny config and data, its finished run folder)."""
    folder = write_tiny(tmp_path_factory.mktemp("robust"), spam_rows)
    amptrain.fit(str(folder / "tiny.toml"), ["precision.policy=float32"], run_dir=str(folder / "run"))
    return folder, folder / "run"


def copy_run(trained, tmp_path, name="run"):
    shutil.copytree(trained[1], tmp_path / name)
    return tmp_path / name


# === 1. The lock and the temporary files ===


def test_a_fit_beside_a_held_lock_is_refused_naming_the_holder(tiny):
    run_dir = tiny / "run"
    lock = RunLock(str(run_dir), "fit").acquire()
    try:
        with pytest.raises(UserError, match=rf"in use by pid {os.getpid()} \(fit\)"):
            amptrain.fit(str(tiny / "tiny.toml"), run_dir=str(run_dir))
    finally:
        lock.release()
    assert not os.path.exists(run_dir / "metrics.jsonl")  # nothing written by the refused fit


def test_a_dead_holders_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    (tmp_path / LOCK_FILE).write_text("999999999 fit\n")  # no such pid; the kernel holds no lock for it
    with caplog.at_level("WARNING", logger="amptrain"):
        lock = RunLock(str(tmp_path), "eval").acquire()
    lock.release()
    assert "taking over the lock of pid 999999999 (fit), which is no longer running" in caplog.text


def test_concurrent_atomic_writes_never_share_a_temporary_file(tmp_path):
    path = str(tmp_path / "state")
    errors = []

    def writer(text):
        try:
            for _ in range(200):
                atomic_write(path, text)
        except OSError as error:  # main: one writer renames the ".tmp" another is writing
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(str(i) * 5000,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = open(path).read()
    assert errors == [] and len(set(text)) == 1 and len(text) == 5000
    assert os.listdir(tmp_path) == ["state"]


# === 2. Learned files checked; a half-written metrics line ===


def test_changed_learned_files_are_refused_in_one_line(trained, tmp_path, capsys):
    run_dir = copy_run(trained, tmp_path)
    labels = json.loads((run_dir / "labels.json").read_text())
    (run_dir / "labels.json").write_text(json.dumps(labels[::-1]))  # main: eval exits 0, predictions inverted
    status, lines = in_process(capsys, "eval", str(run_dir))
    assert status == 2
    assert lines[-1].startswith(f"amptrain: error: {run_dir}/labels.json: changed since the run learned it")
    shutil.copy(trained[1] / "labels.json", run_dir / "labels.json")
    vocabulary = (run_dir / "vocab.txt").read_text().splitlines()
    shuffled = vocabulary[:5] + random.Random(0).sample(vocabulary[5:], len(vocabulary) - 5)
    (run_dir / "vocab.txt").write_text("\n".join(shuffled) + "\n")  # same size, special pieces kept
    for command in (["predict", str(run_dir), "--text", "hello"], ["export", str(run_dir)]):
        status, lines = in_process(capsys, *command)
        assert status == 2 and f"{run_dir}/vocab.txt: changed since the run learned it" in lines[-1]


def test_damaged_learned_files_of_an_unrecorded_run_are_one_line_naming_them(trained, tmp_path, capsys):
    run_dir = copy_run(trained, tmp_path)
    os.remove(run_dir / "learned.json")  # a run folder made before the record existed
    (run_dir / "labels.json").write_bytes(bytes(range(256)))
    status, lines = in_process(capsys, "eval", str(run_dir))
    assert status == 2 and lines[-1].startswith(f"amptrain: error: {run_dir}/labels.json: damaged")
    (run_dir / "labels.json").write_text('["ham", "spam", "eggs"]')  # a third label: the output layer disagrees
    status, lines = in_process(capsys, "eval", str(run_dir))
    assert status == 2
    assert "its weights do not fit the model built from the run folder's learned files" in lines[-1]
    assert "labels.json: 3 entries" in lines[-1] and "incompatible tensor" in lines[-1]


def test_a_half_written_last_metrics_line_is_skipped_with_a_warning(trained, tmp_path, capsys):
    run_dir = copy_run(trained, tmp_path)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 1')  # what a full disk leaves
    status, lines = in_process(
        capsys, "fit", str(trained[0] / "tiny.toml"), "--run-dir", str(run_dir), "--set", "precision.policy=float32"
    )
    assert status == 0  # main: a JSONDecodeError traceback
    assert any("metrics.jsonl:" in line and "not a whole JSON record" in line for line in lines)
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["kind"] == "end"


# === 6. A moved run folder ===


def test_a_moved_run_folder_predicts_and_exports_without_its_data(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path)
    config = (run_dir / "config.toml").read_text().replace(str(trained[0]), "/nonexistent/machine")
    (run_dir / "config.toml").write_text(config)
    (record,) = amptrain.predict(str(run_dir), ["WIN a FREE cruise, click now"])  # main: data.train: expected ...
    assert record["label"] in ("ham", "spam")
    assert amptrain.export(str(run_dir))["path"].endswith("export/1")
    assert_only_amptrains(run_dir)
    with pytest.raises(UserError, match="data.test: expected an existing file.*pass --data PATH"):
        amptrain.evaluate(str(run_dir))


# === 9. predict --input streams ===


def test_predict_input_streams_records_and_shows_progress(trained):
    pulled = []

    def lines():
        for i in range(40):
            pulled.append(i)
            yield f"text number {i}"

    from amptrain.serving.streaming import predict_lines

    progress = io.StringIO()
    records = predict_lines(amptrain.api.predictor(str(trained[1]), True), lines(), chunk_lines=8, stream=progress)
    first = next(records)
    assert first["text"] == "text number 0" and len(pulled) == 8  # main: every line read before any record
    assert len([first, *records]) == 40
    assert "predict: 40 lines done" in progress.getvalue()


def test_predict_input_refuses_a_line_past_the_limit_and_says_when_every_line_was_blank(trained, tmp_path, capsys):
    from amptrain.serving import streaming

    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"first line\n" + b"x" * (streaming.MAX_LINE_BYTES + 1) + b"\nlast\n")
    status, lines = in_process(capsys, "predict", str(trained[1]), "--input", str(huge))
    assert status == 2 and lines == [
        f"amptrain: error: {huge}:2: a line of over 4 MiB; expected one text a line "
        "(a model reads only its first data.max_length pieces)"
    ]
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\t\n")
    progress = io.StringIO()
    predictor = amptrain.api.predictor(str(trained[1]), skip_blank=True)
    records = list(streaming.predict_lines(predictor, streaming.read_text_lines(str(blank)), stream=progress))
    assert records == [] and progress.getvalue() == "predict: 3 lines, all blank: no record (blank lines are skipped)\n"


# === 8. Untrusted inputs ===


def test_an_argument_that_is_not_utf8_is_one_line(trained, capsys):
    not_utf8 = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 argv
    status, lines = in_process(capsys, "predict", str(trained[1]), "--text", not_utf8)
    assert status == 2 and lines == [
        "amptrain: error: argument 4 (caf\\udce9) is not UTF-8 text (byte at 3); "
        "pass UTF-8, or the texts in a UTF-8 file with --input"
    ]


def test_the_export_documentation_says_an_export_is_code():
    docs = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "export.md"), encoding="utf-8").read()
    assert "**An export is code**" in docs and "Load and serve only exports you made or trust." in docs
