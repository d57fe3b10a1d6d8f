"""Bad input to `amptrain export`: one line naming the path or option and what was
expected, before any slow work (quick: nothing is trained or loaded)."""

import shutil
import sys

import pytest

from amptrain import api, cli
from amptrain.errors import UserError


@pytest.fixture
def untrained_run(tiny):
    """A run folder with its config and no checkpoint (as `fit` leaves it before step one)."""
    run = tiny / "run"
    run.mkdir()
    shutil.copy(tiny / "tiny.toml", run / "config.toml")
    return run


def export_error(capsys, *argv):
    """(exit status, stderr) of `amptrain export ARGV`."""
    status = cli.main(["export", *map(str, argv)])
    return status, capsys.readouterr().err


def test_a_run_without_a_checkpoint_is_one_line(untrained_run, capsys):
    status, err = export_error(capsys, untrained_run)
    assert status == 2
    assert (
        err
        == f"amptrain: error: {untrained_run}/checkpoints: no checkpoint to export; train first with `amptrain fit`\n"
    )


def test_a_folder_that_is_no_run(tmp_path, capsys):
    status, err = export_error(capsys, tmp_path)
    assert (
        status == 2
        and err == f"amptrain: error: {tmp_path}: no config.toml; expected a run folder made by `amptrain fit`\n"
    )


@pytest.mark.parametrize(
    "option, expected",
    [
        (
            ["--format", "tflite"],
            "--format tflite: unknown export format; expected one of saved_model, onnx, transformers, gguf",
        ),
        (["--checkpoint", "first"], "--checkpoint first: expected one of best, latest"),
        (["--precision", "int8"], "--precision int8: expected one of float32, bfloat16, float16"),
        (["--version", "v2"], "--version v2: expected a whole number >= 0 (TF Serving's version folder)"),
    ],
)
def test_an_unknown_choice_is_one_line(untrained_run, capsys, option, expected):
    status, err = export_error(capsys, untrained_run, *option)
    assert status == 2 and err == f"amptrain: error: {expected}\n"


def test_an_existing_version_is_refused_without_overwrite(untrained_run, tmp_path, capsys):
    (tmp_path / "out" / "3").mkdir(parents=True)
    status, err = export_error(capsys, untrained_run, "--out", tmp_path / "out", "--version", "3")
    assert status == 2
    expected = f"{tmp_path}/out/3: this export version exists; pass --overwrite to replace it, or --version N"
    assert err == f"amptrain: error: {expected}\n"
    # With --overwrite it goes on, and stops at the next problem: there is nothing to export.
    with pytest.raises(UserError, match="no checkpoint to export"):
        api.export(str(untrained_run), out=str(tmp_path / "out"), version=3, overwrite=True)
    assert (tmp_path / "out" / "3").is_dir()  # the old version is only replaced by a finished export


def test_onnx_without_its_packages_names_the_extra(untrained_run, monkeypatch, capsys):
    # How Python marks a module that cannot be imported: find_spec then finds nothing.
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    status, err = export_error(capsys, untrained_run, "--format", "onnx")
    assert status == 2
    assert err == "amptrain: error: --format onnx needs tf2onnx (not installed); pip install 'amptrain[onnx]'\n"
