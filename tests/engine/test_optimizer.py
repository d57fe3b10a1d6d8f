"""The learning-rate schedule (`WarmupDecay`) and the optimizer `train.*` builds, values by hand."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from amptrain.config import TrainConfig
from amptrain.engine.optimizer import OneKernelAdam, WarmupDecay, build_optimizer, current_learning_rate


def rates(schedule, steps):
    return [round(float(schedule(step)), 6) for step in steps]


def test_warmup_rises_linearly_to_the_peak():
    # Step s of the warm-up runs at peak * (s + 1) / warmup_steps: the first step is not wasted at 0.
    schedule = WarmupDecay(peak=1.0, warmup_steps=4, total_steps=12, decay="constant")
    assert rates(schedule, range(6)) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_decay_reaches_half_halfway_and_zero_at_the_end():
    schedule = WarmupDecay(peak=2.0, warmup_steps=4, total_steps=12, decay="cosine")
    # After the warm-up, progress p = (step - 4) / 8 and the rate is 2 * (1 + cos(pi p)) / 2.
    assert rates(schedule, [4, 6, 8, 10, 12, 40]) == pytest.approx(
        [2.0, 1 + math.cos(math.pi / 4), 1.0, 1 + math.cos(3 * math.pi / 4), 0.0, 0.0], abs=1e-6
    )


def test_linear_decay():
    schedule = WarmupDecay(peak=1.0, warmup_steps=0, total_steps=8, decay="linear")
    assert rates(schedule, [0, 2, 4, 6, 8, 9]) == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]


def test_a_run_shorter_than_its_warmup_still_decays_after_it():
    # total_steps is raised to warmup_steps + 1 so the decay has a step to happen in.
    schedule = WarmupDecay(peak=1.0, warmup_steps=5, total_steps=3, decay="linear")
    assert schedule.total_steps == 6
    assert rates(schedule, [4, 5, 6]) == [1.0, 1.0, 0.0]


def test_the_factor_scales_every_rate():
    # The NaN policy's restore lowers this checkpointed factor.
    schedule = WarmupDecay(peak=1.0, warmup_steps=2, total_steps=10, decay="constant")
    schedule.factor.assign(0.5)
    assert rates(schedule, [0, 1, 5]) == [0.25, 0.5, 0.5]


def test_build_optimizer_from_the_train_section():
    adamw, factor = build_optimizer(
        TrainConfig(optimizer="adamw", learning_rate=1e-3, weight_decay=0.01, warmup_steps=10, decay="linear"),
        total_steps=110,
    )
    assert isinstance(adamw, keras.optimizers.AdamW) and isinstance(adamw, OneKernelAdam)
    assert adamw.weight_decay == 0.01
    assert isinstance(adamw._learning_rate, WarmupDecay) and adamw._learning_rate.factor is factor
    assert current_learning_rate(adamw) == pytest.approx(1e-4)  # step 0 of 10 warm-up steps
    factor.assign(0.5)
    assert current_learning_rate(adamw) == pytest.approx(0.5e-4)
    adam, _ = build_optimizer(TrainConfig(optimizer="adam", learning_rate=1e-3, warmup_steps=0), total_steps=10)
    assert isinstance(adam, OneKernelAdam) and not isinstance(adam, keras.optimizers.AdamW)
    assert adam.weight_decay is None


def applier(optimizer, variables, graph):
    def apply(grads):
        optimizer.apply(grads, variables)

    return tf.function(apply) if graph else apply


@pytest.mark.parametrize("name", ["adamw", "adam"])
@pytest.mark.parametrize("graph", [False, True])
def test_the_one_kernel_update_is_keras_own(name, graph):
    """Five steps of the fused kernel (ResourceApplyAdam, decay before it) against Keras's
    Adam/AdamW on the same gradients and schedule, eager and in a graph, the slots and the
    step count included: equal to float32 rounding (Keras takes `1 - beta_1` in float64: 4e-6
    apart after five steps at rate 0.1, where a decay left out would be 5e-3 a step)."""
    config = TrainConfig(optimizer=name, learning_rate=0.1, weight_decay=0.05, warmup_steps=2, decay="linear")
    ours, _ = build_optimizer(config, total_steps=6)
    theirs_class = keras.optimizers.AdamW if name == "adamw" else keras.optimizers.Adam
    theirs = theirs_class(
        learning_rate=WarmupDecay(0.1, 2, 6, "linear"), **({"weight_decay": 0.05} if name == "adamw" else {})
    )
    start = [np.array([[1.0, -2.0], [0.5, 3.0]], np.float32), np.array([0.25, -0.75], np.float32)]
    pairs = []
    for optimizer in (ours, theirs):
        variables = [keras.Variable(value) for value in start]
        optimizer.build(variables)
        pairs.append((optimizer, variables, applier(optimizer, variables, graph)))
    rng = np.random.default_rng(0)
    for _ in range(5):
        grads = [tf.constant(rng.normal(size=value.shape).astype(np.float32)) for value in start]
        for _, _, apply in pairs:
            apply(grads)
    (a, a_variables, _), (b, b_variables, _) = pairs
    assert int(a.iterations.numpy()) == int(b.iterations.numpy()) == 5
    for x, y in zip(a_variables + a.variables, b_variables + b.variables):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(a_variables[0]), start[0])
