"""Same command, same answer: with `runtime.deterministic = true`, one config trained by two
processes into two folders ends with the same weights (the vocabulary learned in each
process included: it used to differ from process to process)."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def final_weights(tiny, name):
    result = subprocess.run(
        [sys.executable, "-m", "amptrain", "fit", str(tiny / "tiny.toml"), "--set", "runtime.deterministic=true"]
        + ["--set", "train.steps=8", "--run-dir", str(tiny / name)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return re.search(r"final weights (\w+)", result.stderr).group(1), (tiny / name / "vocab.txt").read_bytes()


def test_two_processes_train_the_same_model(tiny):
    (first, first_vocabulary), (second, second_vocabulary) = final_weights(tiny, "a"), final_weights(tiny, "b")
    assert first_vocabulary == second_vocabulary
    assert first == second
