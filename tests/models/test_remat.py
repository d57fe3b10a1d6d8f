"""`model.remat = "blocks"`: each block recomputed in the backward pass gives the step's loss
and gradients of keeping everything (dropout's masks drawn again identically), keeps a
fraction of the activations, and advances the seed generators as without it."""

import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import amptrain
from amptrain import config as config_lib
from amptrain.bench.building import build_trainer
from amptrain.engine import memory
from amptrain.errors import UserError
from amptrain.tasks import prepared_in_scratch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import forked_cli  # noqa: E402


def built(config_path, remat, policy="float32", strategy=None):
    keras.utils.set_random_seed(1)
    settings = [("precision.policy", policy), ("model.remat", remat), ("model.dropout", 0.1)]
    task = prepared_in_scratch(config_lib.load_config(config_path, settings))
    model, _, _ = task.create_model(strategy)
    return task, model


def step(task, model, features, targets, jit):
    @tf.function(jit_compile=jit, autograph=False)
    def run(features, targets):
        with tf.GradientTape() as tape:
            loss_sum, _ = task.loss(targets, model(features, training=True))
        return loss_sum, tape.gradient(loss_sum, model.trainable_variables)

    loss, gradients = run(features, targets)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in gradients]


def same_step(config_path, policy="float32", jit=False):
    """(loss, gradients, seed states) of one step with and without recomputation, from the same
    weights and seed generators."""
    (task, plain), (_, recomputed) = built(config_path, "none", policy), built(config_path, "blocks", policy)
    features, targets = next(iter(task.train_dataset(0)))[:2]
    plain(features), recomputed(features)
    for a, b in zip(plain.variables, recomputed.variables):
        b.assign(a)
    results = [step(task, model, features, targets, jit) for model in (plain, recomputed)]
    seeds = [[np.asarray(v) for v in m.non_trainable_variables] for m in (plain, recomputed)]
    return results, seeds


def assert_same(results, seeds, rtol=1e-6):
    (loss, gradients), (loss_remat, gradients_remat) = results
    assert loss == pytest.approx(loss_remat, rel=rtol)
    for a, b in zip(gradients, gradients_remat):
        assert np.max(np.abs(a - b)) <= rtol * max(np.max(np.abs(a)), 1e-30)
    assert all(np.array_equal(a, b) for a, b in zip(*seeds)), "the seed generators moved differently"


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["graph", "xla"])
def test_a_recomputed_classifier_gives_the_same_loss_and_gradients(tiny, jit):
    assert_same(*same_step(str(tiny / "tiny.toml"), jit=jit))


@pytest.mark.slow
def test_recomputation_under_bfloat16_gives_the_same_step(tiny):
    assert_same(*same_step(str(tiny / "tiny.toml"), policy="mixed_bfloat16"), rtol=1e-2)


@pytest.mark.slow
def test_the_language_model_and_the_translator_recompute_to_the_same_step(tiny_translation, tmp_path):
    from tasks.test_language_model import write_tiny_corpus

    assert_same(*same_step(str(write_tiny_corpus(tmp_path) / "tiny.toml")))
    assert_same(*same_step(str(tiny_translation / "tiny.toml")))


@pytest.mark.parametrize("base", ["float32", pytest.param("int8", marks=pytest.mark.slow)])
def test_a_pretrained_decoder_recomputes_to_the_same_step(tmp_path, base):
    """LoRA on a pretrained Llama: the lean decoder layer, the lean projections' own gradient and
    dropout inside each recomputed layer."""
    from pretrained.test_causal import folder

    (tmp_path / "train.txt").write_text("In the beginning God created the heaven and the earth.\n" * 8)
    (tmp_path / "tiny.toml").write_text(
        f'task = "language_model"\n[data]\ntrain = "{tmp_path / "train.txt"}"\nmax_length = 16\n'
        f'[model]\npretrained = "{folder("llama3")}"\n[train]\nbatch_size = 2\nlora_rank = 2\n'
        f'lora_targets = "query,value,down"\nbase_weights = "{base}"\n'
    )
    # float32 sums in another order with each layer recomputed (seen: 1.01e-6 of the largest)
    assert_same(*same_step(str(tmp_path / "tiny.toml")), rtol=4e-6)
    kept = {}
    for remat in ("none", "blocks"):
        config = config_lib.load_config(str(tmp_path / "tiny.toml"), [("model.remat", remat)])
        task, model, trainer, policy = build_trainer(config)
        kept[remat] = memory.estimate_step(trainer, model, task.signature(), 16, policy, trainer.optimizer)
    assert kept["blocks"].per_row < kept["none"].per_row / 2  # a row: its two layers' inputs and one recomputed


def test_recomputed_blocks_keep_a_fraction_of_a_rows_activations(tiny):
    kept = {}
    for remat in ("none", "blocks"):
        config = config_lib.load_config(
            str(tiny / "tiny.toml"), [("model.remat", remat), ("precision.policy", "float32"), ("model.num_layers", 3)]
        )
        task, model, trainer, policy = build_trainer(config)
        kept[remat] = memory.estimate_step(
            trainer, model, task.signature(), config.data.max_length, policy, trainer.optimizer
        )
    # Three blocks keep their inputs, and one block's recomputation is alive at a time.
    assert kept["blocks"].kept_per_row < kept["none"].kept_per_row / 4
    assert kept["blocks"].per_row < kept["none"].per_row * 0.6


class Block(keras.layers.Layer):
    """A user's residual block with Keras's own dropout."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(16, activation="gelu")
        self.outer = keras.layers.Dense(8)
        self.drop = keras.layers.Dropout(0.3, seed=3)

    def call(self, x, scale=1.0, training=False):
        return x + scale * self.outer(self.drop(self.inner(x), training=training))


def users_model(recompute):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((5, 8))
    x = inputs
    for i in range(3):
        block = Block(name=f"block_{i}")
        x = (amptrain.remat(block) if recompute else block)(x, scale=0.5)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def test_a_users_layer_recomputed_by_amptrain_remat_gives_the_same_gradients():
    plain, recomputed = users_model(False), users_model(True)
    recomputed.set_weights(plain.get_weights())
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 5, 8)), tf.float32)
    results = []
    for model in (plain, recomputed):

        @tf.function(autograph=False)
        def run(x, model=model):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x, training=True) ** 2)
            return loss, tape.gradient(loss, model.trainable_variables)

        loss, gradients = run(x)
        results.append((float(loss), [g.numpy() for g in gradients]))
    seeds = [[np.asarray(v) for v in m.non_trainable_variables] for m in (plain, recomputed)]
    assert seeds[0], "Keras's dropout keeps its seed state as a variable"
    assert_same(results, seeds)
    with pytest.raises(UserError, match="takes no `training` argument"):
        amptrain.remat(keras.layers.Flatten())


TWO_REPLICAS = """
import sys
sys.path.insert(0, {tests!r})
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np
from models.test_remat import built
from amptrain.distribute import distribute_batches
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
results = []
for remat in ("none", "blocks"):
    task, model = built({config!r}, remat, strategy=strategy)
    batches = iter(distribute_batches(strategy, lambda: task.train_dataset(0)))
    features, targets = next(batches)[:2]
    @tf.function(autograph=False)
    def run(features, targets):
        def replica(features, targets):
            with tf.GradientTape() as tape:
                loss_sum, _ = task.loss(targets, model(features, training=True))
            return [tf.convert_to_tensor(g) for g in tape.gradient(loss_sum, model.trainable_variables)]
        return strategy.run(replica, (features, targets))
    gradients = run(features, targets)
    results.append([strategy.reduce("SUM", g, axis=None).numpy() for g in gradients])
worst = max(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30) for a, b in zip(*results))
assert worst <= 1e-6, worst
print("ok")
"""


@pytest.mark.slow
def test_recomputation_under_two_mirrored_replicas_gives_the_same_gradients(tiny):
    # Logical devices are set before TensorFlow starts: a process of its own (forked_cli.py).
    code = TWO_REPLICAS.format(tests=os.path.dirname(HERE), config=str(tiny / "tiny.toml"))
    result = forked_cli.python(["-c", code], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
