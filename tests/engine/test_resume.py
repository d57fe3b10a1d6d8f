"""Killing `amptrain fit` with SIGKILL and running it again continues where it stopped."""

import os
import signal
import subprocess
import sys
import time

import forked_cli  # tests/: `amptrain` forked after the import
import pytest

from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow

SETTINGS = [
    "runtime.deterministic=true",
    "train.steps=60",
    "train.log_every=4",
    "train.checkpoint_every=8",
    "train.eval_every=20",
]


def fit_args(tiny, run_dir, *extra):
    args = ["fit", str(tiny / "tiny.toml"), "--run-dir", str(run_dir)]
    for setting in SETTINGS + list(extra):
        args += ["--set", setting]
    return args


def command(tiny, run_dir, *extra):
    """`python -m amptrain fit ...`: a new Python, for the SIGTERM test (how the program exits)."""
    return [sys.executable, "-m", "amptrain", *fit_args(tiny, run_dir, *extra)]


def committed(run_dir, step):
    """True once the checkpoint of `step` is in the manager's state file (its files come first)."""
    state = run_dir / "checkpoints" / "checkpoint"
    try:
        return f'"ckpt-{step}"' in state.read_text()
    except FileNotFoundError:
        return False


def run(tiny, run_dir, *extra):
    """The fit to its end, forked after the import (forked_cli.py)."""
    result = forked_cli.run(fit_args(tiny, run_dir, *extra), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("ema_decay", [0.0, 0.9])
def test_rerun_after_kill_resumes_and_ends_like_an_uninterrupted_run(tiny, ema_decay):
    # With a weight average, the resumed run must go on with the same average: its dev
    # scores (of the averaged weights) match the uninterrupted run's.
    ema = f"train.ema_decay={ema_decay}"
    interrupted = tiny / "interrupted"
    process = forked_cli.start(fit_args(tiny, interrupted, ema))  # killed below: its pid is the fit's own
    deadline = time.time() + 300
    while not committed(interrupted, 16):
        assert process.poll() is None, "fit ended before it could be interrupted"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -9
    killed = read_metrics(interrupted / "metrics.jsonl")
    assert not any(r["kind"] == "end" for r in killed)

    run(tiny, interrupted, ema)
    run(tiny, tiny / "uninterrupted", ema)

    records = read_metrics(interrupted / "metrics.jsonl")
    runs = [r for r in records if r["kind"] == "run"]
    assert runs[0]["resumed_from_step"] == 0 and runs[-1]["resumed_from_step"] >= 16
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == list(range(4, 61, 4))  # each step once, none missing
    reference = [r for r in read_metrics(tiny / "uninterrupted" / "metrics.jsonl") if r["kind"] == "train"]
    final, expected = [r for r in records if r["kind"] == "train"][-1], reference[-1]
    assert final["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    test = [r for r in records if r["kind"] == "eval" and r["split"] == "test"]
    assert len(test) == 1
    dev = [(r["step"], r["checkpoint"], r["accuracy"]) for r in records if r["kind"] == "eval" and r["split"] == "dev"]
    expected_dev = [
        (r["step"], r["checkpoint"], r["accuracy"])
        for r in read_metrics(tiny / "uninterrupted" / "metrics.jsonl")
        if r["kind"] == "eval" and r["split"] == "dev"
    ]
    assert dev[-1] == expected_dev[-1] and dev[-1][1] == ("average" if ema_decay else "latest")


def test_sigterm_saves_a_checkpoint_of_the_current_step_and_exits_143(tiny):
    run_dir = tiny / "terminated"
    # Long enough not to finish on its own; train.steps may change on a rerun.
    long_run = "train.steps=100000"
    process = subprocess.Popen(
        command(tiny, run_dir, long_run), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while not committed(run_dir, 8):
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.02)
    time.sleep(1.0)  # let it train past the checkpoint
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1].startswith("amptrain: stopped by SIGTERM after saving a checkpoint")
    saved = sorted(int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert saved[-1] > 8  # the step it had reached, not only the last scheduled checkpoint
    run(tiny, run_dir, f"train.steps={saved[-1] + 4}")
    runs = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "run"]
    assert runs[-1]["resumed_from_step"] == saved[-1]
