"""Whole runs that meet bad numbers: a far too large loss scale, a fixed scale that can
never work, a learning rate that blows the weights up. Each must end as documented."""

import os

import forked_cli  # tests/: `amptrain` forked after the import
import pytest

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.errors import NumericsError


def fit(tiny, name, *overrides):
    return amptrain.fit(str(tiny / "tiny.toml"), list(overrides), run_dir=str(tiny / name))


def records(tiny, name, kind):
    return [r for r in read_metrics(tiny / name / "metrics.jsonl") if r["kind"] == kind]


@pytest.mark.slow
def test_too_large_initial_scale_backs_off_then_trains(tiny):
    # 1e10 halves to below fp16's 65504 in about 18 skipped steps; then it trains.
    fit(
        tiny,
        "run",
        "precision.policy=mixed_float16",
        "precision.initial_scale=1e10",
        "train.steps=40",
        "runtime.steps_per_execution=4",
        "model.dropout=0.0",
    )
    train = records(tiny, "run", "train")
    assert train[-1]["skipped_steps"] > 0 and train[-1]["loss_scale"] < 1e10
    finite = [r["loss"] for r in train if r["loss"] is not None]
    assert len(finite) >= 3 and finite[-1] < finite[0]
    overflows = records(tiny, "run", "overflow")
    assert overflows[0]["step"] == 1 and overflows[0]["loss_scale"] == pytest.approx(1e10)
    assert "block_0/ffn_out" in overflows[0]["layers"] and overflows[0]["origin"]
    # The float32 head is never where an fp16 overflow shows.
    assert "logits" not in overflows[0]["layers"]


@pytest.mark.slow
def test_fixed_scale_that_always_overflows_stops_with_a_diagnosis(tiny):
    command = [
        "fit",
        str(tiny / "tiny.toml"),
        "--run-dir",
        str(tiny / "run"),
        "--set",
        "precision.policy=mixed_float16",
        "--set",
        "precision.loss_scale=1e30",
        "--set",
        "precision.max_consecutive_skips=6",
        "--set",
        "train.steps=20",
    ]
    result = forked_cli.run(command, timeout=300)  # `amptrain fit ...` forked after the import
    assert result.returncode == 3, result.stderr[-2000:]
    assert "6 steps in a row were skipped (precision.max_consecutive_skips = 6)" in result.stderr
    assert 'precision.loss_scale = "dynamic" instead of the fixed 1e+30' in result.stderr
    assert "block_0/attention/qkv" in result.stderr
    last = records(tiny, "run", "train")[-1]
    assert (last["step"], last["skipped_steps"], last["consecutive_skips"], last["loss"]) == (6, 6, 6, None)
    # The last good checkpoint (step 4) is intact; nothing was saved after it.
    assert sorted(os.listdir(tiny / "run" / "checkpoints")) == [
        "checkpoint",
        "ckpt-4.data-00000-of-00001",
        "ckpt-4.index",
    ]
    assert not records(tiny, "run", "end")


def test_overflow_at_the_minimum_scale_stops(tiny):
    with pytest.raises(
        NumericsError, match=r"overflowed with the loss scale already at precision.min_scale \(1e\+09\)"
    ):
        fit(
            tiny,
            "run",
            "precision.policy=mixed_float16",
            "precision.initial_scale=8e9",
            "precision.min_scale=1e9",
            "precision.max_scale=1e10",
        )
    # 8e9 -> 4e9 -> 2e9 -> 1e9, then the fourth overflow is at the floor.
    last = records(tiny, "run", "train")[-1]
    assert (last["step"], last["loss_scale"]) == (4, pytest.approx(1e9))


def test_nonfinite_loss_stops_by_default(tiny):
    # Adam's first step moves every weight by about the learning rate: 1e30 breaks the model.
    with pytest.raises(NumericsError, match=r'non-finite loss or gradients \(train.on_nonfinite = "stop"\)'):
        fit(tiny, "run", "train.learning_rate=1e30")
    assert not records(tiny, "run", "end")


def test_nonfinite_loss_skipped_when_asked(tiny):
    fit(tiny, "run", "train.learning_rate=1e30", "train.on_nonfinite=skip")
    train = records(tiny, "run", "train")
    assert train[-1]["step"] == 12 and train[-1]["skipped_steps"] >= 10
    assert records(tiny, "run", "end")


@pytest.mark.slow
def test_restore_goes_back_and_lowers_the_learning_rate(tiny):
    fit(tiny, "run", "train.learning_rate=1e30", "train.on_nonfinite=restore", "train.restore_lr_factor=1e-30")
    restore = records(tiny, "run", "restore")
    assert len(restore) == 1 and restore[0]["step"] == 0 and restore[0]["learning_rate_factor"] == pytest.approx(1e-30)
    train = records(tiny, "run", "train")
    # The replayed steps replaced the old records: each step once, all finite, at lr 1e30 x 1e-30.
    assert [r["step"] for r in train] == [4, 8, 12]
    assert all(r["loss"] is not None and r["skipped_steps"] == 0 for r in train)
    assert train[-1]["learning_rate"] == pytest.approx(1.0)


def test_restore_gives_up_after_max_restores(tiny):
    with pytest.raises(NumericsError, match=r"after 2 restore\(s\)"):
        fit(tiny, "run", "train.learning_rate=1e30", "train.on_nonfinite=restore", "train.max_restores=2")
    assert len(records(tiny, "run", "restore")) == 2
