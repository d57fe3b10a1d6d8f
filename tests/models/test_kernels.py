"""The exact GELU as XLA computations of its own (`xla_modes.kernel`): built in a training
step's scope with kernels on they are XLA function calls, elsewhere the same ops op by op,
and both give the same numbers to the dtype's rounding (XLA keeps a bfloat16 chain's
intermediates in float32, TensorFlow's kernels round each op)."""

import numpy as np
import pytest
import tensorflow as tf

from amptrain import xla_modes
from amptrain.engine.step_runner import StepRunner
from amptrain.models import lean

RNG = np.random.default_rng(3)
X = RNG.normal(size=(4, 8, 32)).astype("float32") * 2
WEIGHTS = tf.constant(RNG.normal(size=(4, 8, 32)), tf.float32)


def xla_calls(graph):
    return [op for op in graph.get_operations() if op.node_def.attr["_XlaMustCompile"].b]


def traced(piece, dtype, kernels):
    """(value, gradient, the XLA function calls in the graph) of `piece` at X in `dtype`,
    built in a step's scope as the step runner builds it."""

    @tf.function(autograph=False)
    def run(x):
        with xla_modes.scope(False, kernels):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = piece(x)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) * WEIGHTS)
            return tf.cast(y, tf.float32), tf.cast(tape.gradient(loss, x), tf.float32)

    x = tf.cast(X, dtype)
    calls = xla_calls(run.get_concrete_function(x).graph)
    y, gradient = run(x)
    return y.numpy(), gradient.numpy(), calls


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_gelu_is_two_xla_calls_only_when_asked_and_computes_the_same(dtype):
    y0, g0, calls0 = traced(lean.gelu, dtype, kernels=False)
    y1, g1, calls1 = traced(lean.gelu, dtype, kernels=True)
    assert calls0 == []
    assert len(calls1) == 2  # forward and backward
    # float32: XLA's and Eigen's own erfc and exp; bfloat16: one rounding more or less
    tolerance = 1e-5 if dtype == "float32" else 2**-7
    scale = max(1.0, float(np.abs(g0).max()))
    np.testing.assert_allclose(y1, y0, atol=tolerance * max(1.0, float(np.abs(y0).max())))
    np.testing.assert_allclose(g1, g0, atol=tolerance * scale)


def test_the_masked_softmax_backward_is_one_xla_call_only_when_asked_and_computes_the_same():
    keep = tf.constant(np.arange(32) < 24)  # the last 8 keys masked

    def piece(x):
        return lean.masked_softmax(x, keep, "bfloat16")

    y0, g0, calls0 = traced(piece, "bfloat16", kernels=False)
    y1, g1, calls1 = traced(piece, "bfloat16", kernels=True)
    assert calls0 == []
    assert len(calls1) == 1  # the backward chain; the forward stays op by op
    np.testing.assert_array_equal(y1, y0)
    # TensorFlow rounds the chain's float32 ops to bfloat16 only at the end too: one rounding apart
    np.testing.assert_allclose(g1, g0, atol=2**-8 * max(1.0, float(np.abs(g0).max())))
    assert np.all(g1[..., 24:] == 0) and np.all(g0[..., 24:] == 0)


def test_the_training_step_builds_kernels_and_evaluation_does_not():
    import keras

    inputs = keras.Input((8, 32))
    hidden = keras.layers.Dense(32, activation=lean.gelu)(inputs)
    model = keras.Model(inputs, lean.LayerNormalization()(hidden))

    def loss_fn(targets, outputs):
        return tf.reduce_sum(tf.square(outputs - targets)), tf.constant(4.0)

    x = tf.constant(X)
    # (jit_compile, fused_kernels): the GELU's forward and backward calls in the step's graph
    for jit, kernels, calls in ((False, False, 0), (False, True, 2), ("fusible", True, 2), (True, True, 0)):
        optimizer = keras.optimizers.SGD(0.1)
        strategy = tf.distribute.get_strategy()
        runner = StepRunner(strategy, model, optimizer, loss_fn, jit_compile=jit, fused_kernels=kernels)
        step = runner.forward_backward.get_concrete_function(x, x, tf.constant(1.0))
        assert len(xla_calls(step.graph)) == calls
        assert xla_calls(runner._predict_step.get_concrete_function(x).graph) == []
