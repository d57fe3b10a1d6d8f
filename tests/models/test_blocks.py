import numpy as np
import tensorflow as tf
from keras import ops

from amptrain.models.blocks import MultiHeadSelfAttention, scaled_dot_product


def indexed_attention(layer, x, padding_mask):
    """The attention as it was: one (3, batch, heads, length, head_dim) tensor, indexed."""
    batch, length = ops.shape(x)[0], ops.shape(x)[1]
    qkv = ops.reshape(layer.qkv(x), (batch, length, 3, layer.num_heads, layer.head_dim))
    qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))
    keep = ops.cast(padding_mask, "bool")[:, None, None, :]
    context = scaled_dot_product(qkv[0], qkv[1], qkv[2], keep, layer.compute_dtype, layer.attention_dropout)
    return layer.output_dense(context)


def test_split_qkv_gives_the_indexed_outputs_and_gradients():
    layer = MultiHeadSelfAttention(16, 2, dtype="float32")
    x = tf.random.stateless_normal((2, 8, 16), seed=(1, 2))
    mask = np.ones((2, 8), bool)
    mask[1, 5:] = False
    results = []
    for attend in (lambda: layer(x, padding_mask=mask), lambda: indexed_attention(layer, x, mask)):
        with tf.GradientTape() as tape:
            out = attend()
            loss = tf.reduce_sum(out * out)
        results.append((out, tape.gradient(loss, layer.trainable_variables)))
    (out, grads), (ref_out, ref_grads) = results
    np.testing.assert_allclose(out.numpy(), ref_out.numpy(), rtol=1e-6, atol=1e-6)
    for g, ref in zip(grads, ref_grads):
        np.testing.assert_allclose(g.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_the_backward_pass_has_no_strided_slice_grad():
    """Each StridedSliceGrad wrote a zero tensor the size of all of qkv: a fifth of a
    step's time without XLA at hidden 256, seq 128 (benchmarks/bf16_vs_peer.py)."""
    layer = MultiHeadSelfAttention(16, 2, dtype="mixed_bfloat16")
    x = tf.zeros((2, 8, 16))
    mask = tf.ones((2, 8), tf.bool)
    layer(x, padding_mask=mask)

    @tf.function
    def grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(layer(x, padding_mask=mask), "float32"))
        return tape.gradient(loss, layer.trainable_variables)

    graph = grads.get_concrete_function(tf.TensorSpec((2, 8, 16))).graph
    op_types = {op.type for op in graph.get_operations()}
    for function in graph._functions.values():
        op_types |= {op.type for op in function.graph.get_operations()}
    assert "StridedSliceGrad" not in op_types


def test_the_cross_attention_splits_keys_and_values_as_it_indexed_them():
    from amptrain.models.blocks import Attention

    layer = Attention(16, 2, dtype="float32")
    context = tf.random.stateless_normal((2, 8, 16), seed=(3, 4))
    layer(context, context, tf.ones((2, 8, 8), tf.bool))
    key, value = layer.keys_values(context)
    kv = ops.transpose(ops.reshape(layer.key_value(context), (2, 8, 2, 2, 8)), (2, 0, 3, 1, 4))
    np.testing.assert_array_equal(key.numpy(), kv[0].numpy())
    np.testing.assert_array_equal(value.numpy(), kv[1].numpy())
