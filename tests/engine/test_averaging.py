"""The weight average (`train.ema_decay`): its numbers by hand, skipped steps, resume,
two mirrored replicas, and a fit whose best checkpoint holds the averaged weights."""

import os

import forked_cli  # tests/: a process forked after the import
import keras
import numpy as np
import pytest
import tensorflow as tf
from poisoned import batches, poisoned_model, squared_error

import amptrain
from amptrain.engine.averaging import WeightAverage
from amptrain.engine.run_log import read_metrics
from amptrain.engine.step_runner import StepRunner
from amptrain.precision.loss_scale import LossScaler

INF = float("inf")
HERE = os.path.dirname(os.path.abspath(__file__))
DECAY = 0.9


def make_trainer(decay=DECAY, scaler=None):
    strategy = tf.distribute.get_strategy()
    model = poisoned_model()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    average = WeightAverage(strategy, model.trainable_variables, decay)
    trainer = StepRunner(strategy, model, optimizer, squared_error, loss_scale=scaler, weight_average=average)
    return trainer, model, optimizer, average


def weights(model):
    return [v.numpy().copy() for v in model.trainable_variables]


def test_average_after_each_step_by_hand_and_a_skipped_step_changes_nothing():
    trainer, model, _, average = make_trainer(scaler=LossScaler(1024.0))
    w0 = weights(model)
    iterator = iter(batches([[1, 1], [1, 1], [1, INF]]))
    # Before any update the "average" is the weights themselves.
    assert all(np.array_equal(a, w) for a, w in zip(average.averaged_values(), w0))
    trainer.train(iterator, 1)
    w1 = weights(model)
    # a_1 = (1 - d) w_1; corrected by 1 - d: exactly w_1, nothing of w_0.
    for a, w in zip(average.averaged_values(), w1):
        np.testing.assert_allclose(a, w, rtol=1e-6)
    trainer.train(iterator, 1)
    w2 = weights(model)
    assert not all(np.array_equal(a, b) for a, b in zip(w1, w2))
    # a_2 = d (1 - d) w_1 + (1 - d) w_2, over 1 - d^2: (d w_1 + w_2) / (1 + d).
    expected = [(DECAY * a + b) / (1 + DECAY) for a, b in zip(w1, w2)]
    for a, e in zip(average.averaged_values(), expected):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    sums = [s.numpy().copy() for s in average.sums]
    for s, a, b in zip(sums, w1, w2):
        np.testing.assert_allclose(s, DECAY * (1 - DECAY) * a + (1 - DECAY) * b, rtol=1e-6)
    totals = trainer.train(iterator, 1)  # the poisoned step is skipped
    assert int(totals["applied_steps"]) == 0
    assert int(average.updates.numpy()) == 2
    assert all(np.array_equal(s.numpy(), t) for s, t in zip(average.sums, sums))
    # Inside `applied` the model holds the average; after it, its own weights again.
    with average.applied():
        for v, e in zip(model.trainable_variables, expected):
            np.testing.assert_allclose(v.numpy(), e, rtol=1e-6)
    assert all(np.array_equal(v, w) for v, w in zip(weights(model), w2))


def test_a_resumed_average_equals_an_uninterrupted_one(tmp_path):
    def checkpoint(model, optimizer, average):
        return tf.train.Checkpoint(model=model, optimizer=optimizer, weight_average=average.trackable)

    data = [[1, 1]] * 4
    uninterrupted, model, _, average = make_trainer()
    uninterrupted.train(iter(batches(data)), 4)
    reference = average.averaged_values()

    first, model, optimizer, average = make_trainer()
    first.train(iter(batches(data[:2])), 2)
    path = checkpoint(model, optimizer, average).save(str(tmp_path / "ckpt"))
    second, model, optimizer, average = make_trainer()
    checkpoint(model, optimizer, average).restore(path).assert_existing_objects_matched()
    assert int(average.updates.numpy()) == 2
    second.train(iter(batches(data[2:])), 2)
    assert int(average.updates.numpy()) == 4
    for a, r in zip(average.averaged_values(), reference):
        np.testing.assert_allclose(a, r, rtol=1e-6)


TWO_REPLICAS = """
import sys
sys.path.insert(0, {here!r})
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from poisoned import batches, poisoned_model, squared_error
from amptrain.engine.averaging import WeightAverage
from amptrain.engine.step_runner import StepRunner

d = {decay}
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = poisoned_model()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    average = WeightAverage(strategy, model.trainable_variables, d)
    trainer = StepRunner(strategy, model, optimizer, squared_error, weight_average=average)
iterator = iter(strategy.experimental_distribute_dataset(batches([[1, 1], [1, 1]])))
def copies(variables):
    return [[r.numpy().copy() for r in (v.value if isinstance(v, keras.Variable) else v).values] for v in variables]
trainer.train(iterator, 1)
w1 = [c[0] for c in copies(model.trainable_variables)]
trainer.train(iterator, 1)
w2 = [c[0] for c in copies(model.trainable_variables)]
sums = copies(average.sums)
assert all(np.array_equal(c[0], c[1]) for c in sums), "the replicas' sums differ"
for c, a, b in zip(sums, w1, w2):
    np.testing.assert_allclose(c[1], d * (1 - d) * a + (1 - d) * b, rtol=1e-6)
with average.applied():
    inside = copies(model.trainable_variables)
for c, a, b in zip(inside, w1, w2):
    for copy in c:
        np.testing.assert_allclose(copy, (d * a + b) / (1 + d), rtol=1e-6)
after = copies(model.trainable_variables)
assert all(np.array_equal(copy, w) for c, w in zip(after, w2) for copy in c), "weights not given back"
print("ok")
"""


@pytest.mark.slow
def test_two_mirrored_replicas_update_both_copies():
    # Logical devices must be set before TensorFlow starts: a process of its own, forked
    # before TensorFlow's runtime started (forked_cli.py).
    result = forked_cli.python(
        ["-c", TWO_REPLICAS.format(here=HERE, decay=DECAY)], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.slow  # trains past a few steps: out of the 5-minute quick tier
def test_fit_scores_dev_and_test_with_the_average_the_best_checkpoint_holds(tiny):
    run_dir = tiny / "run"
    result = amptrain.fit(str(tiny / "tiny.toml"), ["train.eval_every=6", "train.ema_decay=0.9"], run_dir=str(run_dir))
    records = read_metrics(run_dir / "metrics.jsonl")
    assert records[0]["ema_decay"] == 0.9
    evals = [(r["split"], r["step"], r["checkpoint"]) for r in records if r["kind"] == "eval"]
    assert evals[:2] == [("dev", 6, "average"), ("dev", 12, "average")]
    # `evaluate` reads the best checkpoint's model weights: the averaged ones the final test scored.
    scored = amptrain.evaluate(str(run_dir), split="test")
    assert scored["accuracy"] == pytest.approx(result["test"]["accuracy"])
    # The best checkpoint's weights are its bias-corrected averages. (The checkpoint stores
    # each weight once, under the first path that reaches it: the optimizer's list, in the
    # order of the model's trainable variables, as the sums are.)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints" / "best")))
    n = reader.get_tensor("weight_average/updates/.ATTRIBUTES/VARIABLE_VALUE")
    count = sum(1 for k in reader.get_variable_to_shape_map() if k.startswith("weight_average/sums/"))
    best_step = [r for r in records if r["kind"] == "eval" and r["split"] == "test"][0]["step"]
    assert n == best_step and count > 0  # one update a step, none skipped
    for i in range(count):
        averaged = reader.get_tensor(f"weight_average/sums/{i}/.ATTRIBUTES/VARIABLE_VALUE") / (1 - 0.9**n)
        weight = reader.get_tensor(f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE")
        np.testing.assert_allclose(weight, averaged, rtol=1e-5, atol=1e-7)


def test_decay_outside_its_range_is_a_config_error(tiny):
    with pytest.raises(amptrain.errors.ConfigError, match=r"train\.ema_decay: expected a number in \[0, 1\)"):
        amptrain.fit(str(tiny / "tiny.toml"), ["train.ema_decay=1.0"], run_dir=str(tiny / "run"))
