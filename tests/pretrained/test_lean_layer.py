"""Llama's and Qwen2's decoder layer, lean (families/lean_layer.py), against keras-hub's own call
of the same layer on the tiny checkpoints: the same outputs, and the same gradients for the
input and every weight (the norms' scales too, as full fine-tuning trains them), in float32
and under mixed_bfloat16; and its pieces against autodiff of keras-hub's arithmetic."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from pretrained.test_families import folder

from amptrain.config.pretrained import read_checkpoint
from amptrain.tasks.language_model.families.lean_layer import decoder_layer, gated_silu
from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel


def keep_of(segments):
    segments = tf.constant([segments], tf.int32)
    order = tf.range(segments.shape[1])
    return tf.logical_and((order[:, None] >= order[None, :])[None], segments[:, :, None] == segments[:, None, :])


def outputs_and_gradients(run, layer, x, keep):
    variables = layer.trainable_variables
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = run(x, keep)
        weights = tf.reshape(tf.cast(tf.range(tf.size(y)) % 7 - 3, tf.float32), tf.shape(y))
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
    gradients = tape.gradient(loss, [x, *variables])
    assert all(g is not None for g in gradients)
    return [np.asarray(tf.convert_to_tensor(t), np.float32) for t in [y, *gradients]]


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_lean_layer_is_keras_hubs_layer_forward_and_backward(family, policy):
    model = PretrainedLanguageModel(read_checkpoint(folder(family)), 128, 0.0, policy)
    layer = model.blocks[1]
    width = model.backbone.hidden_dim
    dtype = keras.dtype_policies.get(policy).compute_dtype
    x = tf.cast(tf.constant(np.random.RandomState(0).normal(0, 1, (1, 6, width)), tf.float32), dtype)
    keep = keep_of([0, 0, 0, 1, 1, 1])  # two documents packed

    def theirs(x, keep):
        return layer(x, decoder_attention_mask=keep, training=True)

    def ours(x, keep):
        return decoder_layer(layer, x, keep, True)

    from amptrain.tasks.language_model.families import lean_layer

    assert layer.activation in lean_layer._SILU  # the gated SiLU's own backward pass is what runs
    got, expected = outputs_and_gradients(ours, layer, x, keep), outputs_and_gradients(theirs, layer, x, keep)
    # float32: summed in other orders (seen: 6e-7); bfloat16: gradients rounded at other places (8e-3)
    tolerance = 2e-6 if policy == "float32" else 2**-6
    if policy != "float32":
        assert np.array_equal(got[0], expected[0])  # the same ops forward, rounded where keras-hub's are
    for a, b in zip(got, expected):
        assert a.shape == b.shape and np.abs(a - b).max() <= tolerance * max(np.abs(b).max(), 1)


def test_the_gated_silu_keeps_keras_hubs_rounding_and_its_gradient():
    rng = np.random.RandomState(1)
    gate = tf.constant(rng.normal(0, 3, (4, 64)), tf.bfloat16)
    up = tf.constant(rng.normal(0, 1, (4, 64)), tf.bfloat16)

    def autodiff(gate, up):
        return up * tf.cast(tf.nn.silu(tf.cast(gate, tf.float32)), tf.bfloat16)

    results = []
    for function in (gated_silu, autodiff):
        with tf.GradientTape() as tape:
            tape.watch([gate, up])
            y = function(gate, up)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(tf.range(64) % 5 - 2, tf.float32))
        results.append([np.asarray(tf.cast(t, tf.float32)) for t in [y, *tape.gradient(loss, [gate, up])]])
    (y, d_gate, d_up), (y_expected, d_gate_expected, d_up_expected) = results
    assert np.array_equal(y, y_expected)  # the same ops forward
    assert np.array_equal(d_up, d_up_expected)  # dy times the same rounded activation
    assert np.abs(d_gate - d_gate_expected).max() <= 2**-7 * np.abs(d_gate_expected).max()
