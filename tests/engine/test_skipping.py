"""A step with non-finite gradients is skipped whole, and the graph call says why it stopped.

The model of `poisoned.py` makes the gradients of its layer `first` infinite on demand
while the loss stays finite: an fp16 overflow, made to order and exact on any CPU.
"""

import os

import forked_cli  # tests/: a process forked after the import
import keras
import numpy as np
import pytest
import tensorflow as tf
from poisoned import batches, poisoned_model, squared_error

from amptrain.engine.step_runner import NONFINITE_LOSS, RUNNING, TOO_MANY_SKIPS, StepRunner
from amptrain.precision.loss_scale import LossScaler

INF = float("inf")
HERE = os.path.dirname(os.path.abspath(__file__))


def make_trainer(scaler=None, **kwargs):
    strategy = tf.distribute.get_strategy()
    model = poisoned_model()
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    trainer = StepRunner(strategy, model, optimizer, squared_error, loss_scale=scaler, **kwargs)
    return trainer, model, optimizer


def snapshot(model, optimizer):
    return [v.numpy().copy() for v in model.trainable_variables + optimizer.variables]


def test_inf_in_one_gradient_skips_the_step_bit_for_bit():
    scaler = LossScaler(1024.0)
    trainer, model, optimizer = make_trainer(scaler)
    iterator = iter(batches([[1, 1], [1, INF], [1, 1]]))
    trainer.train(iterator, 1)  # one applied step first, so the slots are not all zeros
    before = snapshot(model, optimizer)
    totals = trainer.train(iterator, 1)
    after = snapshot(model, optimizer)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # weights, slots, iterations
    assert int(optimizer.iterations.numpy()) == 1
    assert scaler.scale.numpy() == 512.0
    assert int(trainer.skipped_steps.numpy()) == 1 and int(trainer.step.numpy()) == 2
    # The locator: only `first` (kernel, bias) had non-finite gradients.
    names = [v.path for v in trainer.variables]
    assert [n for n, bad in zip(names, totals["overflow_variables"]) if bad] == ["first/kernel", "first/bias"]
    assert int(totals["overflow_step"]) == 2 and totals["overflow_scale"] == 1024.0
    trainer.train(iterator, 1)
    assert int(optimizer.iterations.numpy()) == 2 and int(trainer.consecutive_skips.numpy()) == 0


def test_totals_of_a_multi_step_call():
    trainer, _, optimizer = make_trainer(LossScaler(1024.0))
    totals = trainer.train(iter(batches([[1, 1], [1, INF], [1, 1], [INF, INF]])), 4)
    assert int(totals["applied_steps"]) == 2 and int(totals["overflow_steps"]) == 2
    assert int(totals["overflow_step"]) == 2  # the first overflow of the call
    assert totals["overflow_scale"] == 1024.0 and trainer.loss_scale.scale.numpy() == 256.0
    assert int(totals["stop"]) == RUNNING and int(optimizer.iterations.numpy()) == 2
    assert np.isfinite(totals["grad_norm"])  # the last applied step's, not the overflow's


def test_call_returns_early_after_max_consecutive_skips():
    trainer, _, _ = make_trainer(LossScaler(1024.0, dynamic=False), max_consecutive_skips=3)
    totals = trainer.train(iter(batches([[1, 1]] + [[INF, 1]] * 6)), 7)
    assert int(totals["stop"]) == TOO_MANY_SKIPS
    assert int(trainer.step.numpy()) == 4  # 1 applied + 3 skipped, then out of the loop
    assert int(trainer.consecutive_skips.numpy()) == 3 and int(trainer.skipped_steps.numpy()) == 3


def test_without_a_scaler_nonfinite_gradients_stop_or_are_skipped():
    stopping, _, _ = make_trainer()
    totals = stopping.train(iter(batches([[1, 1], [INF, 1], [1, 1]])), 3)
    assert int(totals["stop"]) == NONFINITE_LOSS and int(stopping.step.numpy()) == 2
    skipping, _, optimizer = make_trainer(stop_on_nonfinite_loss=False)
    totals = skipping.train(iter(batches([[1, 1], [INF, 1], [1, 1]])), 3)
    assert int(totals["stop"]) == RUNNING and int(totals["nonfinite_steps"]) == 1
    assert int(optimizer.iterations.numpy()) == 2 and int(skipping.skipped_steps.numpy()) == 1


TWO_REPLICAS = """
import sys
sys.path.insert(0, {here!r})
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from poisoned import batches, poisoned_model, squared_error
from amptrain.engine.step_runner import StepRunner
from amptrain.precision.loss_scale import LossScaler

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = poisoned_model()
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    trainer = StepRunner(strategy, model, optimizer, squared_error, loss_scale=LossScaler(1024.0))
# A global batch of 2 splits 1 + 1: only the second replica's example is poisoned.
iterator = iter(strategy.experimental_distribute_dataset(batches([[1, float("inf")], [1, 1]])))
def replicas():
    return [[r.numpy().copy() for r in v.value.values] for v in model.trainable_variables]
before = replicas()
trainer.train(iterator, 1)
after = replicas()
assert all(np.array_equal(a, b) for x, y in zip(before, after) for a, b in zip(x, y)), "a replica changed"
assert trainer.loss_scale.scale.numpy() == 512.0 and int(trainer.skipped_steps.numpy()) == 1
assert int(optimizer.iterations.numpy()) == 0
trainer.train(iterator, 1)
final = replicas()
assert all(np.array_equal(x[0], x[1]) for x in final), "replicas differ"
assert not all(np.array_equal(a, b) for x, y in zip(after, final) for a, b in zip(x, y)), "clean step not applied"
print("ok")
"""


@pytest.mark.slow
def test_one_replica_overflowing_skips_the_step_on_both():
    # Logical devices must be set before TensorFlow starts: a process of its own, forked
    # before TensorFlow's runtime started (forked_cli.py).
    result = forked_cli.python(["-c", TWO_REPLICAS.format(here=HERE)], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
