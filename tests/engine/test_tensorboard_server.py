"""A real TensorBoard server over a finished tiny mixed_float16 run: the scalars a user
looks for, read through its HTTP API with their step axis. Loopback only; the server is
stopped whatever happens."""

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

import amptrain
from amptrain.engine.run_log import read_metrics


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, **query):
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_tensorboard_serves_the_runs_scalars(tiny, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tiny / "cache"))  # its quick peak is no other test's
    from amptrain.hardware import peaks

    quick = peaks.timed_matmul_peak
    monkeypatch.setattr(peaks, "timed_matmul_peak", lambda dtype: quick(dtype, seconds=0.02, max_size=256))
    run_dir = tiny / "run"
    overrides = ["precision.policy=mixed_float16", "train.histogram_every=4"]
    amptrain.fit(str(tiny / "tiny.toml"), overrides, run_dir=str(run_dir))
    records = read_metrics(run_dir / "metrics.jsonl")
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    dev_steps = [r["step"] for r in records if r["kind"] == "eval" and r["split"] == "dev"]
    port = free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(run_dir / "tensorboard")]
    command += ["--port", str(port), "--host", "127.0.0.1", "--load_fast", "false", "--reload_interval", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        runs = {}
        while time.monotonic() < deadline:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                runs = get(port, "/data/plugin/scalars/tags")
                if "train" in runs and "dev" in runs and "metrics/loss" in runs["train"]:
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        assert {"train", "dev"} <= set(runs), runs
        # Grouped as TensorBoard draws them: the scores, then precision, optimizer, speed, memory
        tags = ("metrics/loss", "optimizer/learning_rate", "precision/loss_scale", "precision/skipped_steps")
        for tag in tags + ("throughput/tokens_per_second", "throughput/mfu", "system/peak_memory_bytes"):
            points = get(port, "/data/plugin/scalars/scalars", run="train", tag=tag)  # [[wall time, step, value]]
            assert [step for _, step, _ in points] == train_steps, tag
        losses = get(port, "/data/plugin/scalars/scalars", run="train", tag="metrics/loss")
        expected = [r["loss"] for r in records if r["kind"] == "train"]
        assert [value for _, _, value in losses] == pytest.approx(expected, rel=1e-6)
        assert get(port, "/data/plugin/scalars/scalars", run="train", tag="precision/loss_scale")[0][2] >= 1
        accuracy = get(port, "/data/plugin/scalars/scalars", run="dev", tag="metrics/accuracy")
        assert [step for _, step, _ in accuracy] == dev_steps
        histogram_tags = get(port, "/data/plugin/histograms/tags")["train"]
        assert any(t.startswith("weights/") for t in histogram_tags)
        assert any(t.startswith("gradients/") for t in histogram_tags)
        assert get(port, "/data/plugins_listing")["hparams"]["enabled"]  # the run's hyperparameters
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)
