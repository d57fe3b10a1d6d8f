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


def test_a_spreadsheet_csv_with_a_byte_order_mark_is_read(tmp_path):
    from amptrain.data.readers import read_labelled_text

    (tmp_path / "excel.csv").write_bytes("text,label\nhello there,ham\n".encode("utf-8-sig"))
    assert [(e.text, e.label) for e in read_labelled_text(str(tmp_path / "excel.csv"))] == [("hello there", "ham")]


def test_a_run_folder_that_cannot_be_written_is_one_line(tiny, capsys):
    (tiny / "a-file").write_text("not a folder")
    status, lines = in_process(capsys, "fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "a-file" / "run"))
    assert status == 2
    assert lines == [
        f"amptrain: error: {tiny}/a-file/run: cannot write the run folder (Not a directory); "
        "pass --run-dir a folder you can write"
    ]


def test_eval_of_a_binary_config_is_one_line(tmp_path, capsys):
    (tmp_path / "config.toml").write_bytes(bytes(range(256)))
    status, lines = in_process(capsys, "eval", str(tmp_path))
    assert status == 2
    assert lines == [f"amptrain: error: {tmp_path}/config.toml: not a TOML text file (invalid start byte at byte 128)"]


def test_predict_input_that_is_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "input.txt").write_bytes(b"fine line\n\xff\xfe broken\n")
    status, lines = in_process(capsys, "predict", str(tmp_path), "--input", str(tmp_path / "input.txt"))
    assert status == 2
    assert lines == [f"amptrain: error: {tmp_path}/input.txt: not UTF-8 text (invalid start byte at byte 10)"]


def test_a_run_that_failed_before_training_does_not_block_its_retry(tiny, capsys):
    (tiny / "bad.csv").write_text("text,label\nfine,ham\nthree,fields,here\n")
    run = str(tiny / "run")
    status, _ = in_process(
        capsys, "fit", str(tiny / "tiny.toml"), "--set", f"data.dev={tiny}/bad.csv", "--run-dir", run
    )
    assert status == 2 and (tiny / "run" / "config.toml").exists()
    from amptrain import api
    from amptrain import config as config_lib

    corrected = config_lib.load_config(str(tiny / "tiny.toml"))
    api._claim_run_dir(corrected, run, overwrite=False)  # the retry's first step: no "different config"
    assert config_lib.differing_keys(config_lib.load_config(f"{run}/config.toml", base_dir=run), corrected) == []
    # A run that trained is still protected.
    (tiny / "run" / "checkpoints").mkdir()
    (tiny / "run" / "checkpoints" / "ckpt-4.index").write_bytes(b"")
    with pytest.raises(api.ConfigError, match="different config"):
        api._claim_run_dir(config_lib.load_config(str(tiny / "tiny.toml"), ["model.hidden_dim=32"]), run, False)


def test_a_port_beyond_the_range_is_one_line(tmp_path, capsys):
    status, lines = in_process(capsys, "serve", str(tmp_path), "--port", "70000")
    assert (status, lines) == (2, ["amptrain: error: --port 70000: expected a port from 0 to 65535 (0: a free one)"])


def test_a_truncated_export_is_one_line_naming_its_folder(tmp_path, capsys):
    """A version folder with a cut `saved_model.pb` (and its metadata): `predict` on it."""
    version = tmp_path / "export" / "1"
    (version / "assets.extra").mkdir(parents=True)
    (version / "assets.extra" / "amptrain-export.json").write_text('{"task": "classification", "labels": ["a"]}')
    (version / "saved_model.pb").write_bytes(b"\x08\x01\x12")
    status, lines = in_process(capsys, "predict", str(tmp_path / "export"), "--text", "hello")
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith(f"amptrain: error: {version}: cannot load this SavedModel (")
