"""The loss scaler's arithmetic, one update at a time, with numbers to check by hand."""

import os

import pytest
import tensorflow as tf

from amptrain.config import PrecisionConfig
from amptrain.engine.checkpoints import Checkpoints
from amptrain.precision.loss_scale import LossScaler, build_scaler

CLEAN, OVERFLOW, NAN_LOSS = (True, True), (True, False), (False, False)


def run(scaler, *steps):
    """Applies (loss_finite, grads_finite) updates; returns the at-floor flags."""
    return [bool(scaler.update(tf.constant(a), tf.constant(b))) for a, b in steps]


def test_overflow_backs_off_and_resets_growth():
    scaler = LossScaler(1024.0, growth_interval=3)
    run(scaler, CLEAN, CLEAN, OVERFLOW)
    assert scaler.scale.numpy() == 512.0
    assert scaler.growth_count.numpy() == 0
    assert scaler.overflows.numpy() == 1


def test_growth_after_interval_clean_steps():
    scaler = LossScaler(1024.0, growth_interval=3)
    run(scaler, CLEAN, CLEAN)
    assert scaler.scale.numpy() == 1024.0
    run(scaler, CLEAN)
    assert scaler.scale.numpy() == 2048.0 and scaler.growth_count.numpy() == 0
    run(scaler, CLEAN, CLEAN, CLEAN)
    assert scaler.scale.numpy() == 4096.0


def test_nonfinite_loss_leaves_the_scale_alone():
    scaler = LossScaler(1024.0, growth_interval=2)
    run(scaler, CLEAN, NAN_LOSS)
    assert scaler.scale.numpy() == 1024.0 and scaler.growth_count.numpy() == 1 and scaler.overflows.numpy() == 0
    run(scaler, CLEAN)  # the NaN step neither counted nor reset the growth count
    assert scaler.scale.numpy() == 2048.0


def test_hysteresis_backs_off_from_the_nth_overflow_in_a_row():
    scaler = LossScaler(1024.0, hysteresis=2)
    run(scaler, OVERFLOW)
    assert scaler.scale.numpy() == 1024.0
    run(scaler, OVERFLOW)
    assert scaler.scale.numpy() == 512.0
    run(scaler, OVERFLOW)
    assert scaler.scale.numpy() == 256.0
    run(scaler, CLEAN, OVERFLOW)  # a clean step resets the streak
    assert scaler.scale.numpy() == 256.0


def test_min_scale_clamps_and_an_overflow_at_the_floor_is_reported():
    scaler = LossScaler(3.0, min_scale=2.0)
    assert run(scaler, OVERFLOW) == [False]
    assert scaler.scale.numpy() == 2.0  # 1.5 clamped up to the floor
    assert run(scaler, OVERFLOW) == [True]
    assert scaler.scale.numpy() == 2.0


def test_max_scale_clamps_growth_but_not_a_larger_initial_scale():
    scaler = LossScaler(3 * 2.0**22, growth_interval=1, max_scale=2.0**24)
    run(scaler, CLEAN)
    assert scaler.scale.numpy() == 2.0**24  # 6 * 2**22 clamped
    run(scaler, CLEAN)
    assert scaler.scale.numpy() == 2.0**24
    large = LossScaler(1e10, growth_interval=1, max_scale=2.0**24)
    run(large, CLEAN)
    assert large.scale.numpy() == pytest.approx(1e10)


def test_fixed_scale_never_moves_but_counts_overflows():
    scaler = LossScaler(1e30, dynamic=False)
    assert run(scaler, OVERFLOW, OVERFLOW, CLEAN, OVERFLOW) == [False] * 4
    assert scaler.scale.numpy() == pytest.approx(1e30)
    assert scaler.overflows.numpy() == 3


def test_build_scaler_follows_the_config():
    assert build_scaler(PrecisionConfig(), "float32") is None
    assert build_scaler(PrecisionConfig(), "mixed_bfloat16") is None
    assert build_scaler(PrecisionConfig(), "mixed_float16").dynamic
    assert build_scaler(PrecisionConfig(loss_scale="none"), "mixed_float16") is None
    forced = build_scaler(PrecisionConfig(loss_scale="dynamic", initial_scale=8.0), "float32")
    assert forced.dynamic and forced.scale.numpy() == 8.0
    fixed = build_scaler(PrecisionConfig(loss_scale=128.0), "mixed_float16")
    assert not fixed.dynamic and fixed.scale.numpy() == 128.0


def test_scaler_state_survives_a_checkpoint_round_trip(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(7, dtype=tf.int64)
    scaler = LossScaler(1024.0, growth_interval=5, hysteresis=3)
    run(scaler, CLEAN, CLEAN, OVERFLOW, OVERFLOW)
    saved = [v.numpy() for v in (scaler.scale, scaler.growth_count, scaler.overflow_streak, scaler.overflows)]
    assert saved == [1024.0, 0, 2, 2]
    checkpoints = Checkpoints(os.fspath(tmp_path), model, optimizer, step, {"loss_scale": scaler})
    checkpoints.save()
    run(scaler, OVERFLOW, CLEAN, CLEAN)
    assert checkpoints.restore_latest() == 7
    assert [v.numpy() for v in (scaler.scale, scaler.growth_count, scaler.overflow_streak, scaler.overflows)] == saved
