"""On one device with XLA the whole step after the iterator pull is one compiled cluster
(`Trainer.fused`): forward and backward, the reduce, the skip decision, AdamW's update,
the loss scaler and the counters. It must train exactly as the unfused path does (only
the forward and backward pass under XLA, the rest run by TensorFlow's executor, as under
several replicas), skip a step just as whole, and restore from a checkpoint alike.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from poisoned import batches, poisoned_model, squared_error

from amptrain import config as config_lib
from amptrain.bench.building import build_trainer
from amptrain.distribute import is_single_device
from amptrain.engine.checkpoints import Checkpoints
from amptrain.engine.step_runner import StepRunner
from amptrain.precision.loss_scale import LossScaler

INF = float("inf")

# The tiny classifier with everything the update does switched on: dropout (its seed
# states are updated inside the step), AdamW with weight decay and a warm-up schedule,
# clipping at a norm the gradients exceed, and a dynamic loss scale that grows every
# 2 clean steps (its variables are updated inside the step too).
SETTINGS = [
    "runtime.jit_compile=true",
    "train.warmup_steps=3",
    "train.clip_norm=0.05",
    "precision.loss_scale=dynamic",
    "precision.initial_scale=4",
    "precision.growth_interval=2",
]


def state(trainer):
    variables = trainer.model.variables + trainer.optimizer.variables + list(trainer.loss_scale.variables)
    return [v.numpy().copy() for v in variables] + [int(c.numpy()) for c in trainer.counters().values()]


def build(tiny, fuse_step, task=None):
    config = config_lib.load_config(str(tiny / "tiny.toml"), SETTINGS)
    task, _, trainer, _ = build_trainer(config, task=task, fuse_step=fuse_step)
    return task, trainer


def test_fusing_needs_one_device_and_xla():
    model, optimizer = poisoned_model(), keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    default = tf.distribute.get_strategy()
    assert StepRunner(default, model, optimizer, squared_error, jit_compile=True).fused
    assert not StepRunner(default, model, optimizer, squared_error, jit_compile=False).fused
    assert not StepRunner(default, model, optimizer, squared_error, jit_compile=True, fuse_step=False).fused
    assert is_single_device(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert not is_single_device(tf.distribute.MirroredStrategy(["/cpu:0"]))  # merge_call: never fused


@pytest.mark.slow
def test_fused_and_unfused_steps_train_alike(tiny):
    task, fused = build(tiny, fuse_step=True)
    _, unfused = build(tiny, fuse_step=False, task=task)
    assert fused.fused and not unfused.fused
    start = state(unfused)
    assert all(np.array_equal(a, b) for a, b in zip(state(fused), start))  # the same seed, the same start
    totals = {}
    for name, trainer in (("fused", fused), ("unfused", unfused)):
        iterator = iter(task.train_dataset(0))
        totals[name] = [trainer.train(iterator, 3) for _ in range(3)]  # 9 steps, 3 graph calls
    assert int(fused.optimizer.iterations.numpy()) == 9 and int(fused.step.numpy()) == 9
    assert fused.loss_scale.scale.numpy() == unfused.loss_scale.scale.numpy() == 4.0 * 2**4
    for a, b in zip(totals["fused"], totals["unfused"]):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=key)
    # Not bit for bit: XLA fuses the update's arithmetic (and may order the gradient
    # norm's sums otherwise), so the paths round differently, by a few float32 ulps a
    # step. A real difference (a step applied twice or not at all, a wrong scale, decay
    # or clip) moves weights by about the learning rate (3e-3), orders of magnitude more.
    names = [v.path for v in fused.model.variables + fused.optimizer.variables]
    moved = 0
    for name, a, b, before in zip(names, state(fused), state(unfused), start):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
        moved += not np.array_equal(a, before)
    assert moved > len(fused.model.trainable_variables)  # the weights and the slots did move


@pytest.mark.parametrize("scaler", [True, False])
def test_a_skipped_step_changes_nothing_under_the_fused_step(scaler):
    model = poisoned_model()
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    loss_scale = LossScaler(1024.0) if scaler else None
    trainer = StepRunner(
        tf.distribute.get_strategy(),
        model,
        optimizer,
        squared_error,
        loss_scale=loss_scale,
        jit_compile=True,
        clip_norm=1.0,
        stop_on_nonfinite_loss=False,
    )
    assert trainer.fused
    iterator = iter(batches([[1, 1], [1, INF], [1, 1]]))
    trainer.train(iterator, 1)  # one applied step first, so the slots are not all zeros

    def snapshot():
        return [v.numpy().copy() for v in model.trainable_variables + optimizer.variables]

    before = snapshot()
    totals = trainer.train(iterator, 1)
    assert all(np.array_equal(a, b) for a, b in zip(before, snapshot()))  # weights, slots, iterations
    assert int(optimizer.iterations.numpy()) == 1 and int(totals["applied_steps"]) == 0
    assert int(trainer.skipped_steps.numpy()) == 1 and int(trainer.consecutive_skips.numpy()) == 1
    assert int(trainer.step.numpy()) == 2
    if scaler:
        assert loss_scale.scale.numpy() == 512.0 and int(loss_scale.overflows.numpy()) == 1
        assert int(totals["overflow_step"]) == 2 and totals["overflow_scale"] == 1024.0
    else:
        assert int(totals["nonfinite_steps"]) == 1
    trainer.train(iterator, 1)
    assert int(optimizer.iterations.numpy()) == 2 and int(trainer.consecutive_skips.numpy()) == 0
    assert not np.array_equal(before[0], model.trainable_variables[0].numpy())


@pytest.mark.slow
def test_a_checkpoint_restores_into_a_compiled_fused_step(tiny, tmp_path):
    """The NaN policy's `restore` and a resume both assign a checkpoint to the variables
    a compiled step already captured: the replayed steps must come out the same."""
    task, trainer = build(tiny, fuse_step=True)
    state_vars = {"loss_scale": trainer.loss_scale, **trainer.counters()}
    checkpoints = Checkpoints(str(tmp_path / "checkpoints"), trainer.model, trainer.optimizer, trainer.step, state_vars)
    trainer.train(iter(task.train_dataset(0)), 3)
    checkpoints.save()
    trainer.train(iter(task.train_dataset(3)), 3)
    first = state(trainer)
    assert checkpoints.restore_latest() == 3
    trainer.train(iter(task.train_dataset(3)), 3)
    assert all(np.array_equal(a, b) for a, b in zip(first, state(trainer)))
    # A fresh process's trainer (a new model, nothing compiled yet) resumes alike.
    _, resumed = build(tiny, fuse_step=True, task=task)
    fresh = Checkpoints(
        str(tmp_path / "checkpoints"),
        resumed.model,
        resumed.optimizer,
        resumed.step,
        {"loss_scale": resumed.loss_scale, **resumed.counters()},
    )
    assert fresh.restore_latest() == 3
    resumed.train(iter(task.train_dataset(3)), 3)
    assert all(np.array_equal(a, b) for a, b in zip(first, state(resumed)))


# Run in a fresh process: TensorFlow reads TF_CPP_VMODULE once, when it loads, and at
# level 1 its device compiler logs one line for each XLA compile it does.
COMPILE_COUNT_SCRIPT = """
import sys
import tensorflow as tf
from amptrain import config as config_lib
from amptrain.bench.building import build_trainer

for path in sys.argv[1:]:
    config = config_lib.load_config(path, ["runtime.jit_compile=true", "runtime.steps_per_execution=2"])
    task, _, trainer, _ = build_trainer(config)
    assert trainer.fused
    batch = next(iter(task.train_dataset(0)))
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    for _ in range(4):  # the weights, slots, scale and seeds change after every step
        trainer.train(iterator, 2)
    print("calls done:", path, file=sys.stderr, flush=True)
"""


@pytest.mark.slow
def test_the_fused_step_compiles_once_for_a_batch_shape(tiny, tiny_ner, tiny_translation):
    """Four graph calls of two steps on one batch shape: one XLA compile, not one a call.
    (An output of a nested function that XLA needs as a constant once made it take the
    batch and every weight as constants: 8-10 s of compiling on every call, at 36 ms a step.)"""
    import os
    import subprocess
    import sys

    configs = [str(folder / "tiny.toml") for folder in (tiny, tiny_ner, tiny_translation)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "device_compiler=1"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_COUNT_SCRIPT, *configs], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiles, counts = 0, {}
    for line in result.stderr.splitlines():
        if "Compilation of XLA executable time" in line:
            compiles += 1
        elif line.startswith("calls done: "):
            counts[line.split()[-1]], compiles = compiles, 0
    assert counts == {path: 1 for path in configs}
