"""User mistakes end with one line on stderr naming the key or path:line, and exit 2.

In this process through `cli.main` (the quick tier), and once more as the `amptrain`
command (slow: a process of its own), where nothing else may reach stderr."""

import subprocess
import sys

import pytest

from amptrain.cli import main


def amptrain(*args):
    return subprocess.run([sys.executable, "-m", "amptrain", *args], capture_output=True, text=True, timeout=300)


def in_process(capsys, *args):
    """(exit status, stderr lines) of `amptrain ARGS` run by `cli.main` here."""
    capsys.readouterr()
    status = main(list(args))
    return status, capsys.readouterr().err.strip().splitlines()


def test_config_error_is_one_line_naming_the_key(tiny, capsys):
    status, lines = in_process(
        capsys, "fit", str(tiny / "tiny.toml"), "--set", "model.num_heads=3", "--run-dir", str(tiny / "run")
    )
    assert status == 2
    assert lines == ["amptrain: error: model.num_heads: expected a divisor of model.hidden_dim (16), received 3"]


def test_malformed_data_row_is_one_line_naming_path_and_line(tiny, capsys):
    (tiny / "bad.csv").write_text("text,label\nfine,ham\nthree,fields,here\n")
    status, lines = in_process(
        capsys, "fit", str(tiny / "tiny.toml"), "--set", f"data.dev={tiny}/bad.csv", "--run-dir", str(tiny / "run")
    )
    assert status == 2
    assert lines[-1] == f"amptrain: error: {tiny}/bad.csv:3: expected 2 fields (text, label), received 3"


def test_eval_of_a_folder_that_is_no_run(tmp_path, capsys):
    status, lines = in_process(capsys, "eval", str(tmp_path))
    assert status == 2
    assert "no config.toml" in lines[-1]


@pytest.mark.slow
def test_the_command_prints_nothing_but_the_line(tiny):
    result = amptrain("fit", str(tiny / "tiny.toml"), "--set", "model.num_heads=3", "--run-dir", str(tiny / "run"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "amptrain: error: model.num_heads: expected a divisor of model.hidden_dim (16), received 3"
    ]
    (tiny / "bad.csv").write_text("text,label\nfine,ham\nthree,fields,here\n")
    result = amptrain(
        "fit", str(tiny / "tiny.toml"), "--set", f"data.dev={tiny}/bad.csv", "--run-dir", str(tiny / "run")
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"amptrain: error: {tiny}/bad.csv:3: expected 2 fields (text, label), received 3"
    )
    result = amptrain("eval", str(tiny / "nothing"))
    assert result.returncode == 2 and "no config.toml" in result.stderr.strip().splitlines()[-1]
