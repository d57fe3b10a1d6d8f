"""The commands print what matters: TensorFlow's start-up chatter (absl's preamble, the
oneDNN notice, the CUDA probe of a machine without a driver) and the retracing warning
stay off stderr; a real TensorFlow error stays on it (`amptrain/tf_logs.py`)."""

import os
import re
import subprocess
import sys

import pytest

from amptrain import tf_logs

START_UP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1796229957.513164    5019 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.\n",
    "I0000 00:00:1796229957.514572    5019 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
    "GPU will not be used.\n",
    "E0000 00:00:1796229963.753599    5019 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)\n",
]
NOISE = re.compile(r"absl::InitializeLog|cuInit|cuda drivers|oneDNN custom operations|retracing")


def test_the_start_up_lines_of_a_machine_without_gpu_are_noise():
    assert tf_logs.is_noise(START_UP) == [True, True, True, True]


def test_a_real_error_and_a_failing_cuinit_with_a_driver_stay():
    error = "E0000 00:00:1.0  5019 op_kernel.cc:1840] OP_REQUIRES failed at matmul_op.cc:58 : INVALID_ARGUMENT\n"
    assert tf_logs.is_noise([START_UP[0], error]) == [True, False]
    assert tf_logs.is_noise([START_UP[3]]) == [False]  # no "no driver" line: a GPU machine's real failure


def test_verbose_is_the_environment_variable(monkeypatch):
    monkeypatch.setenv(tf_logs.VERBOSE_ENV, "1")
    assert tf_logs.verbose()
    monkeypatch.setenv(tf_logs.VERBOSE_ENV, "0")
    assert not tf_logs.verbose()


def amptrain(*args, env=None):
    env = {key: value for key, value in (env or os.environ).items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-m", "amptrain", *args], capture_output=True, text=True, timeout=300, env=env
    )


def noise(result):
    return [line for line in result.stderr.splitlines() if NOISE.search(line)]


@pytest.mark.slow
def test_commands_print_no_tensorflow_chatter(tiny):
    """One tiny run shared by fit, predict, export and doctor, each its own process."""
    run = str(tiny / "run")
    fit = amptrain("fit", str(tiny / "tiny.toml"), "--set", "train.steps=4", "--run-dir", run)
    assert fit.returncode == 0, fit.stderr
    assert "test (best checkpoint)" in fit.stderr  # amptrain's own lines are there
    predict = amptrain("predict", run, "--text", "WIN a FREE cruise")
    assert predict.returncode == 0 and '"label"' in predict.stdout, predict.stderr
    export = amptrain("export", run)
    assert export.returncode == 0, export.stderr
    doctor = amptrain("doctor", "--no-peaks")
    assert doctor.returncode == 0, doctor.stderr
    for result in (fit, predict, export, doctor):
        assert noise(result) == [], result.args
    assert predict.stderr.strip() == ""
    # Asked for, TensorFlow's own lines are back.
    verbose = amptrain("--verbose", "predict", run, "--text", "hello")
    assert verbose.returncode == 0 and any("absl::InitializeLog" in line for line in noise(verbose))
