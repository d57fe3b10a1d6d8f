"""`runtime.jit_compile = "fusible"` (xla_modes.py): XLA compiles the forward and
backward pass but its matrix products, which stay TensorFlow's kernels; it trains as
the executor does without XLA."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT

from amptrain import config as config_lib
from amptrain import xla_modes
from amptrain.bench.building import build_trainer
from amptrain.engine.profiling import host_events


def op_types(logdir):
    """{op type: count} of the TensorFlow ops the trace in `logdir` ran on the host."""
    return collections.Counter(name.rsplit(":", 1)[1] for _, name, _ in host_events(logdir) if ":" in name)


def build(tiny, jit, task=None, dropout=0.1, policy="float32"):
    overrides = [f"runtime.jit_compile={jit}", f"model.dropout={dropout}", f"precision.policy={policy}"]
    config = config_lib.load_config(str(tiny / "tiny.toml"), overrides)
    task, _, trainer, _ = build_trainer(config, task=task)
    return task, trainer


def test_the_modes_and_the_ops_left_to_tensorflow():
    assert xla_modes.whole(True) and not xla_modes.whole(False) and not xla_modes.whole("fusible")
    assert [xla_modes.describe(m) for m in xla_modes.MODES] == ["on", "off", "fusible"]
    with xla_modes.scope(False):
        pass  # no effect, and no XLA scope to leave

    @tf.function
    def marked(x, w):
        with xla_modes.scope("fusible"):
            return tf.nn.gelu(tf.matmul(x, w))

    graph = marked.get_concrete_function(tf.TensorSpec((2, 3)), tf.TensorSpec((3, 4))).graph
    # All but the arguments and the result.
    inside = [op for op in graph.get_operations() if op.type not in ("Placeholder", "Identity")]
    compiled = {op.type: op.get_attr("_XlaCompile") for op in inside}
    assert compiled.pop("MatMul") is False
    assert compiled and all(compiled.values())  # the GELU's ops


# The random numbers stay TensorFlow's kernels, so dropout's masks are those without XLA.
@pytest.mark.slow  # two trainers compiled twice: about 25 s
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fusible_computes_the_step_of_its_reference(tiny, dropout):
    task, fusible = build(tiny, '"fusible"', dropout=dropout)
    _, other = build(tiny, "false", task=task, dropout=dropout)
    features, targets, _ = next(iter(task.train_dataset(0)))
    scale = tf.constant(1.0)
    loss, count, gradients = fusible.forward_backward(features, targets, scale)
    expected_loss, expected_count, expected = other.forward_backward(features, targets, scale)
    assert float(count) == float(expected_count) > 0
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-5)
    # Not bit for bit: XLA's fused loops round otherwise (its exp and erf are its own
    # approximations); a wrong mask or a missing term would differ by far more.
    norm = float(tf.linalg.global_norm(expected))
    for a, b, variable in zip(gradients, expected, fusible.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6 * norm, err_msg=variable.path)


def test_fusible_in_bf16_computes_what_bf16_does_without_xla(tiny):
    """In bf16 each side rounds results to 8 bits at other places (a bias gradient's sum
    of 256 bf16 terms differed by up to 10% here), so the whole step is compared."""
    task, fusible = build(tiny, '"fusible"', dropout=0.0, policy="mixed_bfloat16")
    _, other = build(tiny, "false", task=task, dropout=0.0, policy="mixed_bfloat16")
    features, targets, _ = next(iter(task.train_dataset(0)))
    scale = tf.constant(1.0)
    loss, _, gradients = fusible.forward_backward(features, targets, scale)
    expected_loss, _, expected = other.forward_backward(features, targets, scale)
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-2)
    difference = tf.linalg.global_norm([a - b for a, b in zip(gradients, expected)])
    assert float(difference) < 0.05 * float(tf.linalg.global_norm(expected))


def test_fusible_clusters_all_but_the_matrix_products(tiny, tmp_path):
    task, trainer = build(tiny, '"fusible"')
    before = trainer.model.trainable_variables[0].numpy().copy()
    iterator = iter(task.train_dataset(0))
    trainer.train(iterator, 2)
    tf.profiler.experimental.start(str(tmp_path))
    totals = trainer.train(iterator, 2)
    tf.profiler.experimental.stop()
    ran = op_types(str(tmp_path))
    assert ran["_XlaRun"] > 0
    # The matrix products still run as TensorFlow ops (oneDNN's _MklMatMul on this build).
    assert sum(n for op, n in ran.items() if "MatMul" in op) > 0
    assert int(totals["applied_steps"]) == 2 and np.isfinite(totals["loss_total"])
    assert not np.array_equal(trainer.model.trainable_variables[0].numpy(), before)


@pytest.mark.slow  # the spam data's vocabulary and a compile: about 30 s
def test_fusible_trains_on_batches_of_one_static_shape(monkeypatch):
    """`amptrain bench --data synthetic` repeats one batch (of the spam config here): every
    shape is static. A dropout written `tf.where(keep, x * scale, zeros_like(x))` then made
    the clustering build a cycle ("N nodes in a cycle" at the first call); `x * scale *
    cast(keep)` does not."""
    from amptrain.bench.worker import one_batch_repeated
    from amptrain.distribute import distribute_batches

    monkeypatch.chdir(ROOT)
    small = ["model.num_layers=1", "model.hidden_dim=16", "model.num_heads=2", "model.intermediate_dim=32"]
    overrides = ['runtime.jit_compile="fusible"', "runtime.steps_per_execution=2", "model.dropout=0.1", *small]
    config = config_lib.load_config("configs/classify-spam.toml", ["precision.policy=float32", *overrides])
    task, _, trainer, _ = build_trainer(config)
    batches = one_batch_repeated(task.train_dataset(0))
    iterator = iter(distribute_batches(trainer.strategy, lambda: batches))
    totals = trainer.train(iterator, 2)
    assert int(totals["applied_steps"]) == 2 and np.isfinite(totals["loss_total"])


@pytest.mark.parametrize("jit", ["true", "false", '"fusible"'])
def test_predict_under_each_mode(tiny, jit):
    task, trainer = build(tiny, jit)
    outputs = trainer.predict(task.train_dataset(0).take(2))
    assert len(outputs) == 2 and all(np.isfinite(o).all() for o in outputs)
