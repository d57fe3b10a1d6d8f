"""Memory and MFU in `train` records (`engine/utilisation.py`): the arithmetic by hand, the
/proc reading on a fake file, and a tiny fit whose records and TensorBoard scalars carry them."""

import glob
import os
import time

import pytest

import amptrain
from amptrain.engine.run_log import Window, read_metrics
from amptrain.engine.utilisation import Utilisation, resident_memory
from amptrain.hardware import peaks


def test_mfu_by_hand(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    window = Window()
    window.started = 998.0  # 2 seconds: 600 real tokens are 300 tokens/s
    window.add({"loss_total": 1.0, "applied_steps": 1, "overflow_steps": 0, "tokens": [600, 800], "examples": 10,
                "grad_norm": 1.0}, 1)  # fmt: skip
    # 100 + 2 * length FLOPs a token at the mean padded length 80: 260; a peak of 1e6 FLOP/s
    utilisation = Utilisation(lambda length: 100 + 2 * length, (1e6, "test"))
    assert utilisation.mfu(window) == pytest.approx(260 * 300 / 1e6)
    assert Utilisation(lambda length: 1.0, None).mfu(window) is None  # no peak, no MFU
    assert utilisation.mfu(Window()) is None  # nothing trained in the window


def test_resident_memory_from_proc(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert resident_memory(str(status)) == (1024 * 1024, 2048 * 1024)
    assert resident_memory(str(tmp_path / "missing")) == (None, None)
    rss, peak = resident_memory()  # this process, for real
    assert 0 < rss <= peak


def test_train_records_carry_memory_and_mfu(tiny, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tiny / "cache"))  # its quick peak is no other test's
    quick = peaks.timed_matmul_peak
    monkeypatch.setattr(peaks, "timed_matmul_peak", lambda dtype: quick(dtype, seconds=0.02, max_size=256))
    # The cache holds a peak measured while the machine was busy: far too low, so the first
    # window's MFU would pass 100%. It is reported as 100%, the peak is measured again before
    # the next window, and the cache keeps the better figure.
    peaks.measured_peaks(["bfloat16"], lambda dtype: (1e6, 64))
    run_dir = tiny / "run"
    amptrain.fit(str(tiny / "tiny.toml"), ["precision.policy=mixed_bfloat16"], run_dir=str(run_dir))
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    for record in train:
        assert 0 < record["memory_bytes"] <= record["peak_memory_bytes"]
    assert train[0]["mfu"] == 1.0  # capped, never above
    assert all(0 < record["mfu"] < 1 for record in train[1:])  # a tiny model is far from the real peak
    log = (run_dir / "train.log").read_text()
    assert "bfloat16 matrix product" in log and "MFU passed 100% against 0.0 GFLOP/s" in log
    cached = peaks.cached_peaks()["bfloat16"]
    assert cached["measurements"] == 2 and cached["flops"] == cached["last_flops"] > 1e6

    import tensorflow as tf

    tags, graphs = set(), 0
    for path in glob.glob(os.path.join(run_dir, "tensorboard", "train", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags |= {value.tag for value in event.summary.value}
            graphs += bool(event.graph_def)
    assert {"throughput/mfu", "system/memory_bytes", "system/peak_memory_bytes"} <= tags
    assert "_hparams_/session_start_info" in tags  # the run's hyperparameters, for the hparams plugin
    assert graphs == 1  # the training call's graph, once
