"""User mistakes end with one line on stderr naming the key or path:line, and exit 2."""

import subprocess
import sys


def amptrain(*args):
    return subprocess.run([sys.executable, "-m", "amptrain", *args], capture_output=True, text=True, timeout=300)


def test_config_error_is_one_line_naming_the_key(tiny):
    result = amptrain("fit", str(tiny / "tiny.toml"), "--set", "model.num_heads=3", "--run-dir", str(tiny / "run"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "amptrain: error: model.num_heads: expected a divisor of model.hidden_dim (16), received 3"
    ]


def test_malformed_data_row_is_one_line_naming_path_and_line(tiny):
    (tiny / "bad.csv").write_text("text,label\nfine,ham\nthree,fields,here\n")
    result = amptrain("fit", str(tiny / "tiny.toml"), "--set", f"data.dev={tiny}/bad.csv", "--run-dir", str(tiny / "run"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"amptrain: error: {tiny}/bad.csv:3: expected 2 fields (text, label), received 3"
    )


def test_eval_of_a_folder_that_is_no_run(tmp_path):
    result = amptrain("eval", str(tmp_path))
    assert result.returncode == 2
    assert "no config.toml" in result.stderr.strip().splitlines()[-1]
