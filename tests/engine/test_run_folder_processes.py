"""The run-folder hazards only real processes and a real disk show: two `fit`s on
one folder, and a disk that fills up during a save (a small tmpfs, mounted as root)."""

import os
import shutil
import subprocess
import time

import forked_cli  # tests/: `amptrain` forked after the import
import pytest

from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow


def amptrain(*args, wait=True):
    if not wait:  # a process this test signals or waits on (its pid the command's own)
        return forked_cli.start(args)
    return forked_cli.run(args, timeout=300)


def error_lines(stderr):
    """stderr without TensorFlow's start-up chatter (C++ logging that TF_CPP_MIN_LOG_LEVEL misses)."""
    return [line for line in stderr.splitlines() if line.startswith("amptrain:")]


def test_two_fits_on_one_run_folder_one_is_refused_naming_the_holder(tiny):
    run_dir = str(tiny / "run")
    fit = ["fit", str(tiny / "tiny.toml"), "--run-dir", run_dir, "--set", "precision.policy=float32"]  # no probe
    first = amptrain(*fit, wait=False)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(run_dir, "config.toml")) and time.time() < deadline:
        time.sleep(0.1)  # the first holds the lock before it writes its config
    second = amptrain(*fit)  # refused in about a second (before TensorFlow loads); the first trains for 10+
    _, err = first.communicate(timeout=300)
    # main: both train to the end, 55 of 178 records duplicated and interleaved, two `end` records
    assert second.returncode == 2, second.stderr
    assert error_lines(second.stderr) == [
        f"amptrain: error: {run_dir}: in use by pid {first.pid} (fit); wait for it to end, "
        "or pass --run-dir another folder"
    ]
    assert first.returncode == 0, err
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == [4, 8, 12] and [r["kind"] for r in records].count("end") == 1


@pytest.fixture
def small_disk(tmp_path):
    """A 700 KiB tmpfs: room for the run's files and one checkpoint, not for three."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(mount)]).returncode:
        pytest.skip("this machine does not let root mount a tmpfs")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_one_line_and_leaves_no_temporary_folder(tiny, small_disk, tmp_path):
    run_dir = small_disk / "run"
    fit = ["fit", str(tiny / "tiny.toml"), "--run-dir", str(run_dir), "--set", "precision.policy=float32"]
    result = amptrain(*fit)
    assert result.returncode == 2, result.stderr  # main: exit 1 after a 79-line traceback
    (line,) = error_lines(result.stderr)
    assert line.startswith(f"amptrain: error: {run_dir}: no space left on device (")
    assert "rerun the same command to resume" in line
    left = [os.path.join(d, n) for d, dirs, files in os.walk(run_dir) for n in dirs + files if "_temp" in n]
    assert left == []  # main: checkpoints/ckpt-N_temp/
    moved = tmp_path / "roomy"  # the same folder on a disk with room: the rerun resumes and finishes
    shutil.copytree(run_dir, moved)
    import amptrain as api  # in this process: a second TensorFlow start-up would cost 10 s

    api.fit(str(tiny / "tiny.toml"), ["precision.policy=float32"], run_dir=str(moved))
    assert read_metrics(moved / "metrics.jsonl")[-1]["kind"] == "end"
