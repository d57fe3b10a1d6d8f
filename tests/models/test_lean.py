"""The lean layers: Keras's forward arithmetic, autodiff's gradients, and a backward pass that
keeps its input in the compute dtype instead of float32 copies (`models/lean.py`)."""

import keras
import numpy as np
import tensorflow as tf

from amptrain.engine.memory import graph_memory
from amptrain.models import lean

RNG = np.random.default_rng(0)
X = tf.constant(RNG.normal(size=(3, 5, 16)) * 2, tf.float32)
WEIGHTS = tf.constant(RNG.normal(size=(3, 5, 16)), tf.float32)


def value_and_gradient(function, x, *variables):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = function(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * WEIGHTS[..., : y.shape[-1]])
    return y, tape.gradient(loss, [x, *variables])


def test_gelu_is_keras_exact_gelu_and_its_gradient_autodiffs():
    ours, (our_gradient,) = value_and_gradient(lean.gelu, X)
    theirs, (their_gradient,) = value_and_gradient(lambda x: keras.activations.gelu(x, approximate=False), X)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_allclose(our_gradient.numpy(), their_gradient.numpy(), atol=1e-6)


def test_layer_normalization_equals_keras_in_value_and_every_gradient():
    ours, theirs = lean.LayerNormalization(epsilon=1e-6), keras.layers.LayerNormalization(epsilon=1e-6)
    ours.build(X.shape)
    theirs.build(X.shape)
    ours.gamma.assign(RNG.normal(size=16).astype("float32"))
    ours.beta.assign(np.linspace(-1, 1, 16).astype("float32"))
    theirs.set_weights(ours.get_weights())
    y1, g1 = value_and_gradient(ours, X, ours.gamma, ours.beta)
    y2, g2 = value_and_gradient(theirs, X, theirs.gamma, theirs.beta)
    np.testing.assert_allclose(y1.numpy(), y2.numpy(), atol=1e-6)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    assert ours.get_config() == {**theirs.get_config(), "name": ours.name}


def test_masked_softmax_in_float32_is_the_softmax_and_in_bfloat16_its_gradient_to_bfloat16s_precision():
    scores = tf.cast(tf.constant(RNG.normal(size=(2, 3, 4, 16)) * 3, tf.bfloat16), tf.float32)  # held by both
    weights = tf.constant(RNG.normal(size=(2, 3, 4, 16)), tf.float32)
    # keys 12.. masked; row 3 of the first example masked whole (its probabilities 1/16, no gradient)
    keep = np.broadcast_to(np.arange(16) < 12, (2, 1, 4, 16)).copy()
    keep[0, 0, 3] = False
    results = {}
    for dtype, mask in (("float32", None), ("bfloat16", None), ("float32", keep), ("bfloat16", keep)):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            probabilities = lean.masked_softmax(tf.cast(scores, dtype), mask, dtype)
            loss = tf.reduce_sum(tf.cast(probabilities, tf.float32) * weights)
        gradient = tf.cast(tape.gradient(loss, scores), tf.float32).numpy()
        results[dtype, mask is None] = (tf.cast(probabilities, tf.float32).numpy(), gradient)
    np.testing.assert_array_equal(results["float32", True][0], tf.nn.softmax(scores).numpy())
    masked = tf.where(keep, scores, -1e9)
    np.testing.assert_array_equal(results["float32", False][0], tf.nn.softmax(masked).numpy())
    np.testing.assert_allclose(results["bfloat16", False][0][0, :, 3], 1 / 16)  # the row masked whole
    assert np.all(results["float32", False][1][~np.broadcast_to(keep, scores.shape)] == 0)
    for unmasked in (True, False):
        (p32, g32), (p16, g16) = results["float32", unmasked], results["bfloat16", unmasked]
        np.testing.assert_allclose(p16, p32, atol=2**-8)
        np.testing.assert_allclose(g16, g32, atol=3 * 2**-8 * max(1.0, float(np.abs(g32).max())))
    assert np.all(results["bfloat16", False][1][~np.broadcast_to(keep, scores.shape)] == 0)


def kept_for_backward(function, dtype):
    """{(op, dtype): bytes} of the forward tensors the backward pass of `function` reads."""
    x = tf.Variable(tf.cast(X, dtype))

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(function(x * 1), tf.float32))
        return loss, tape.gradient(loss, [x])

    traced = step.get_concrete_function()
    return graph_memory(traced.graph, traced.structured_outputs[0], traced.outputs)[1]


def test_in_bfloat16_the_backward_pass_keeps_no_float32_copy_of_the_input():
    norm = lean.LayerNormalization(epsilon=1e-6, dtype="mixed_bfloat16")
    norm.build(X.shape)
    size = int(np.prod(X.shape))
    for function in (norm, lean.gelu, lambda x: lean.masked_softmax(x, None, "bfloat16")):
        kept = kept_for_backward(function, "bfloat16")
        float32 = {key: value for key, value in kept.items() if key[1] == "float32" and value >= size * 4}
        assert not float32, kept
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype="mixed_bfloat16")
    keras_norm.build(X.shape)
    kept = kept_for_backward(keras_norm, "bfloat16")  # what it replaces keeps float32 copies
    assert sum(v for k, v in kept.items() if k[1] == "float32") >= 2 * size * 4
