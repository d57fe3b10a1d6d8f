"""`amptrain.Trainer` as a Keras user expects it: their optimizer, their callbacks, a
history, keyword settings, and one-line refusals of what it cannot honour.

The model is dense (no Embedding): Keras's Adam updates an Embedding's slots from the sparse
gradient's rows before repeated ids are summed (`ops.square` of an IndexedSlices), where the
engine updates from the dense gradient, so `model.fit` and the Trainer would differ there by
design, not by precision."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.errors import UserError

RNG = np.random.default_rng(0)
X = RNG.normal(size=(160, 8)).astype("float32")
Y = ((X[:, 0] + 0.8 * RNG.normal(size=160)) > 0).astype("int32")  # a noisy rule: dev loss falls, then rises
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def batches(first, last):
    return tf.data.Dataset.from_tensor_slices((X[first:last], Y[first:last])).batch(16)


def build(policy):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, dtype="float32", name="logits")(hidden))


def adamw():
    return keras.optimizers.AdamW(keras.optimizers.schedules.ExponentialDecay(0.02, 8, 0.9))


def trainer(tmp_path, **changes):
    arguments = dict(
        model=build, loss=LOSS, train=batches(0, 96), validation=batches(96, 160), optimizer=adamw(),
        precision="float32", jit_compile=False, run_dir=str(tmp_path / "run"),
    )  # fmt: skip
    arguments.update(changes)
    return amptrain.Trainer(**arguments)


def test_early_stopping_stops_where_model_fit_stops_under_a_mixed_policy(tmp_path):
    """Under mixed_float16 (Keras wraps its optimizer in a LossScaleOptimizer, amptrain scales
    the loss itself): the same dev losses, the same stopping epoch, the same history keys."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = build("mixed_float16")
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(optimizer=adamw(), loss=LOSS)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)
    expected = model.fit(
        batches(0, 96), validation_data=batches(96, 160), epochs=30, callbacks=[stop], verbose=0, shuffle=False
    )
    ours = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)
    history = trainer(tmp_path, precision="mixed_float16", epochs=30, callbacks=[ours]).fit()
    assert history.epoch == expected.epoch and len(history.epoch) < 30  # it stopped early, at the same epoch
    assert sorted(history.history) == sorted(expected.history) == ["loss", "val_loss"]
    np.testing.assert_allclose(history.history["val_loss"], expected.history["val_loss"], atol=1e-4)
    assert ours.stopped_epoch == stop.stopped_epoch and history.test == {}
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert records[-1]["kind"] == "end" and [r for r in records if r["kind"] == "epoch"][-1]["stop_training"]


class Seen(keras.callbacks.Callback):
    """What a user's own callback is told."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin",))

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("batch_end", batch))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, sorted(logs)))

    def on_train_end(self, logs=None):
        self.calls.append(("train_end",))


def test_keras_callbacks_are_told_of_each_call_and_epoch_and_set_the_rate(tmp_path):
    """Steps per execution 3 over 6 steps an epoch: two batch-end calls an epoch, at batches
    2 and 5, as under Keras's fit; the scheduler's rate reaches the training step; CSVLogger
    writes Keras's columns."""
    seen = Seen()
    halve = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.01 * 0.5**epoch)
    csv = tmp_path / "log.csv"
    history = trainer(
        tmp_path, optimizer=keras.optimizers.AdamW(0.01), epochs=2, steps_per_execution=3,
        callbacks=[seen, halve, keras.callbacks.CSVLogger(str(csv))], config={"train.log_every": 6},
    ).fit()  # fmt: skip
    keys = ["loss", "val_loss"]
    assert seen.calls == [
        ("train_begin",), ("epoch_begin", 0), ("batch_end", 2), ("batch_end", 5), ("epoch_end", 0, keys),
        ("epoch_begin", 1), ("batch_end", 2), ("batch_end", 5), ("epoch_end", 1, keys), ("train_end",),
    ]  # fmt: skip
    rates = [r["learning_rate"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert rates == pytest.approx([0.01, 0.005])
    assert csv.read_text().splitlines()[0] == "epoch,learning_rate,loss,val_loss" and len(history.history["loss"]) == 2


def checkpoint(run, step):
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("save_counter", "_CHECKPOINTABLE"))
    }


class KillAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            raise KeyboardInterrupt  # as Ctrl-C: the engine saves, then stops


def test_a_resumed_run_keeps_your_optimizers_state_bit_for_bit(tmp_path):
    sets = {"runtime.deterministic": True, "train.checkpoint_every": 4, "runtime.steps_per_execution": 1}
    whole = trainer(tmp_path / "whole", steps=12, config=sets)
    whole.fit()
    killed = trainer(tmp_path / "killed", steps=12, config=sets, callbacks=[KillAt(7)])  # in the second epoch
    with pytest.raises(KeyboardInterrupt):
        killed.fit()
    history = trainer(tmp_path / "killed", steps=12, config=sets).fit()  # a fresh optimizer, restored
    expected, got = checkpoint(tmp_path / "whole" / "run", 12), checkpoint(tmp_path / "killed" / "run", 12)
    assert expected.keys() == got.keys() and any("optimizer/_variables/" in name for name in got)  # its slots
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert history.epoch == [0, 1]  # the epochs before the kill too, read from the run's records


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"optimizer": keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())}, r"optimizer: a LossScaleOpt"),
        ({"optimizer": "adamm"}, r"optimizer: Keras knows no optimizer 'adamm'"),
        ({"optimizer": 0.01}, r"optimizer: expected a keras.optimizers.Optimizer, its name, a function that makes"),
        ({"callbacks": [keras.callbacks.ModelCheckpoint("x.keras")]}, r"ModelCheckpoint is not taken: amptrain"),
        ({"callbacks": [keras.callbacks.TensorBoard()]}, r"TensorBoard is not taken: .*run_dir/tensorboard"),
        (
            {"optimizer": None, "callbacks": [keras.callbacks.LearningRateScheduler(lambda e, r: r)]},
            r"LearningRateScheduler sets the optimizer's learning rate, .* pass optimizer=",
        ),
        ({"dev": batches(96, 160)}, r"validation and dev: both name the split"),
        ({"epochs": 2, "config": {"train.epochs": 3}}, r"epochs= and config\['train.epochs'\]: the same setting"),
        ({"config": {"train.learning_rate": 1e-3}}, r"config\['train.learning_rate'\]: does not apply with optimizer="),
        ({"batch_size": 32}, r"batch_size: 32, but the train dataset's batches have 16 rows"),
        (  # this process ran TensorFlow long ago: too late for logical devices
            {"config": {"runtime.cpu_replicas": 2}},
            r"runtime.cpu_replicas = 2: TensorFlow already ran an op .* call amptrain.configure_devices\(",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(UserError, match=message) as caught:
        trainer(tmp_path, **changes).fit()
    assert "\n" not in str(caught.value)


def test_a_built_optimizer_and_one_made_outside_a_mirrored_scope_are_refused():
    from amptrain import config as config_lib
    from amptrain.engine.optimizer import user_optimizer

    train = config_lib.config_from_dict({"task": "keras_model"}, []).train
    used = keras.optimizers.Adam()
    used.build([keras.Variable(1.0)])
    with pytest.raises(UserError, match=r"already built for other variables; pass a fresh one"):
        user_optimizer(used, tf.distribute.get_strategy(), train)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0"])
    outside = keras.optimizers.AdamW()
    with mirrored.scope(), pytest.raises(UserError, match=r"made outside the MirroredStrategy's scope.*lambda"):
        user_optimizer(outside, mirrored, train)
    with mirrored.scope():  # a function that makes one: called under the scope
        assert user_optimizer(lambda: keras.optimizers.AdamW(), mirrored, train)._distribution_strategy is mirrored
