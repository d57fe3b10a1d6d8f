"""Llama's and Qwen2's decoder layer for training and scoring, lean: keras-hub's forward
arithmetic on amptrain's mask (causal and same-document), with a backward pass that keeps
only what its gradients need, in a graph of fewer nodes. Its sub-layers are the layer's own
(the projections, LoRA's or a quantized base's among them, the dropouts), called as
keras-hub calls them; RoPE's rotation is keras-hub's arithmetic too.

    shared = {"rotation": rotation_of(first_layer, x)}   # once a forward pass
    x = decoder_layer(layer, x, keep, training, **shared)   # keep: bool (batch, query, key)

Under a mixed policy keras-hub's layer keeps, for each decoder layer and position, float32
copies its gradients do not need: each RMS norm's float32 input (and its normalised product
when the scale trains), the feed-forward gate in float32 (SiLU runs in float32, as
`torch.nn.functional.silu` does) and its activation's cast, and the attention's float32
probabilities beside their cast; and the keys and values repeated to every query head.
Here:

- `rms_norm` keeps its input in the compute dtype and one float32 number a position (the
  reciprocal root mean square), and recomputes the normalised input when the backward pass
  reaches it;
- `gated_silu` (up × SiLU(gate) in float32, cast as keras-hub does) keeps the gate and the up
  projection in the compute dtype, and its backward pass is one XLA kernel (in a training step
  with `runtime.fused_kernels`);
- the softmax is `models.lean.masked_softmax`, which keeps only the cast probabilities;
- each key-value head is read in place by its group of query heads (`_grouped_attention`);
- RoPE's cos and sin are made once a forward pass, where keras-hub made them twice a layer
  (a few hundred graph nodes each, with Llama 3's frequency scaling).

On SmolLM2-135M with LoRA at 8 × 128 positions, with the projections' own products
(`projections.py`), the whole `fit`'s peak went from 3.7 to 2.7 GiB and the step's function
from 23,800 graph nodes to 15,100 (docs/benchmarks.md). Each gradient equals autodiff's
through keras-hub's layer to rounding (tests/pretrained/test_lean_layer.py). A layer whose
activation is not SiLU runs its activation as keras-hub does.
"""

import keras
import tensorflow as tf

from amptrain.models.lean import after, masked_softmax
from amptrain.tasks.language_model.families.decoding import head_size
from amptrain.xla_modes import kernel

_SILU = (keras.ops.silu, keras.activations.silu)  # keras-hub's backbones pass the first


def decoder_layer(layer, x, keep, training, rotation=None):
    """keras-hub's Llama or Qwen2 decoder layer (LlamaTransformerDecoder, QwenTransformerDecoder)
    on `x` (batch, positions, width) without a cache; `keep` is the attention mask, `rotation`
    RoPE's (cos, sin) for these positions (`rotation_of(layer, x)`, the same for every layer)."""
    attention = layer._self_attention_layer
    dtype = layer.compute_dtype
    rotary = attention.rotary_embedding_layer
    cos, sin = rotation if rotation is not None else rotation_of(layer, x)
    normed = rms_norm(x, layer._self_attention_layernorm, dtype)
    query = rotary._apply_rotary_pos_emb(attention._query_dense(normed), cos, sin)
    key = rotary._apply_rotary_pos_emb(attention._key_dense(normed), cos, sin)
    value = attention._value_dense(normed)
    attended = _grouped_attention(attention, query, key, value, keep, dtype)
    attended = attention._output_dense(attention._dropout_layer(attended, training=training))
    x = x + layer._self_attention_dropout(attended, training=training)
    normed = rms_norm(x, layer._feedforward_layernorm, dtype)
    gate, up = layer._feedforward_gate_dense(normed), layer._feedforward_intermediate_dense(normed)
    if layer.activation in _SILU:
        gated = gated_silu(gate, up)
    else:
        gated = up * tf.cast(layer.activation(tf.cast(gate, tf.float32)), dtype)
    return x + layer._feedforward_output_dense(gated)


def rotation_of(layer, x):
    """RoPE's (cos, sin), each (1, positions, 1, head size) in the compute dtype, for positions
    0 to n - 1 of `x` (batch, n, width): keras-hub's own arithmetic (the layer's
    `_compute_cos_sin_embedding`, with Llama 3's frequency scaling), made once a forward pass
    instead of twice a layer."""
    attention = layer._self_attention_layer
    size = head_size(attention)
    return attention.rotary_embedding_layer._compute_cos_sin_embedding(tf.zeros((1, tf.shape(x)[1], 1, size)), 0)


def _grouped_attention(attention, query, key, value, keep, dtype):
    """softmax(q kᵀ / sqrt(size)) v with each key-value head read by its group of query heads
    in place (query head j reads key-value head j // group, as keras-hub's repeated keys give),
    the keys and values not repeated: (batch, positions, heads, size) out. The group's query
    rows are stacked (group × positions) for one batched product a key-value head, as
    `decoding.decoder_step` does: faster here than keras-hub's einsums over repeated keys, and
    than one five-axis einsum (benchmarks/grouped_attention.py)."""
    kv_heads, group = attention.num_key_value_heads, attention.num_key_value_groups
    batch, positions, heads, size = (d if d is not None else tf.shape(query)[i] for i, d in enumerate(query.shape))
    rows = tf.transpose(tf.reshape(query, (batch, positions, kv_heads, group, size)), (0, 2, 3, 1, 4))
    rows = tf.reshape(rows, (batch, kv_heads, group * positions, size))
    scores = tf.matmul(rows, tf.transpose(key, (0, 2, 1, 3)), transpose_b=True)
    scores = scores * tf.cast(attention._inv_norm_factor, scores.dtype)
    probabilities = masked_softmax(scores, tf.tile(keep, (1, group, 1))[:, None], dtype)
    attended = tf.matmul(probabilities, tf.transpose(value, (0, 2, 1, 3)))
    attended = tf.transpose(tf.reshape(attended, (batch, kv_heads, group, positions, size)), (0, 3, 1, 2, 4))
    return tf.reshape(attended, (batch, positions, heads, size))


def rms_norm(x, norm, dtype):
    """keras-hub's LlamaLayerNorm / QwenLayerNorm `norm` of x: x / sqrt(mean(x²) + epsilon) × scale
    in float32, returned in `dtype`; the scale read as the layer reads it (in the compute dtype
    under a mixed policy: Keras' autocast)."""
    scale = tf.cast(tf.cast(tf.convert_to_tensor(norm.scale.value), dtype), tf.float32)
    return _rms_norm(tf.cast(x, dtype), scale, norm.epsilon)


def _rms_norm(x, scale, epsilon):
    @tf.custom_gradient
    def forward(x, scale):
        x32 = tf.cast(x, tf.float32)
        inverse = tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + epsilon)
        y = tf.cast(x32 * inverse * scale, x.dtype)

        def backward(dy):
            with after(dy):
                normed = tf.cast(x, tf.float32) * inverse
            dnormed = tf.cast(dy, tf.float32) * scale
            dscale = tf.reduce_sum(tf.cast(dy, tf.float32) * normed, axis=tf.range(tf.rank(dy) - 1))
            dx = inverse * (dnormed - normed * tf.reduce_mean(dnormed * normed, axis=-1, keepdims=True))
            return tf.cast(dx, x.dtype), dscale

        return y, backward

    return forward(x, scale)


def gated_silu(gate, up):
    """up × SiLU(gate), the SiLU in float32 and cast to up's dtype (keras-hub's SwiGLU);
    keeps `gate` and `up` only."""

    @tf.custom_gradient
    def forward(gate, up):
        # tf.nn.silu's arithmetic (x sigmoid(x)), not the op, which is a custom gradient of its
        # own: its wrapper (an IdentityN over the float32 gate) has no use inside this one.
        g = tf.cast(gate, tf.float32)
        activated = tf.cast(g * tf.sigmoid(g), up.dtype)

        def backward(dy):
            return _gated_silu_gradient(gate, up, dy)

        return up * activated, backward

    return forward(gate, up)


@kernel
def _gated_silu_gradient(gate, up, dy):
    # (d gate, d up) in float32, returned in their dtypes: the activation's cast rounded as the
    # forward pass rounded it, so d up is dy times what multiplied up.
    g = tf.cast(gate, tf.float32)
    sigmoid = tf.sigmoid(g)
    activated = tf.cast(tf.cast(g * sigmoid, up.dtype), tf.float32)
    dy32 = tf.cast(dy, tf.float32)
    dgate = dy32 * tf.cast(up, tf.float32) * sigmoid * (1.0 + g * (1.0 - sigmoid))
    return tf.cast(dgate, gate.dtype), tf.cast(dy32 * activated, up.dtype)
