"""Transformer building blocks shared by every task's model: the embedding, the
attention layers (self-attention; queries over another sequence's keys and values) and
the pre-norm encoder and decoder blocks.

Each layer takes `dtype` (a Keras dtype policy such as "mixed_bfloat16") and passes it
to its sublayers: variables are float32, arithmetic runs in the policy's compute dtype,
and the few places where half precision is unsafe are float32 islands, each saying why.

    embedding = TokenAndPositionEmbedding(8000, 128, 64, dtype="mixed_bfloat16")
    block = PreNormBlock(64, 4, 128, dropout=0.1, dtype="mixed_bfloat16")
    x = block(embedding(token_ids), padding_mask)  # (batch, length, hidden)
"""

import keras
from keras import ops

from amptrain.models.dropout import Dropout
from amptrain.models.lean import LayerNormalization, gelu, masked_softmax
from amptrain.models.remat import recomputed


@keras.saving.register_keras_serializable(package="amptrain")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned position embedding."""

    def __init__(self, vocabulary_size, max_length, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.max_length = max_length
        self.hidden_dim = hidden_dim
        # === Layers ===
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size, hidden_dim, dtype=self.dtype_policy, name="token_embedding"
        )
        self.position_embedding = keras.layers.Embedding(
            max_length, hidden_dim, dtype=self.dtype_policy, name="position_embedding"
        )

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build((None,))

    def call(self, token_ids):
        length = ops.shape(token_ids)[1]
        positions = self.position_embedding(ops.arange(length))  # (length, hidden)
        return self.token_embedding(token_ids) + positions[None]  # (batch, length, hidden)

    def get_config(self):
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "max_length": self.max_length,
            "hidden_dim": self.hidden_dim,
        }


# Read by `amptrain audit` (models/islands.py); the casts in `scaled_dot_product` say the same.
SOFTMAX_REASON = "the masked softmax: exp() of fp16 scores overflows past 11, and the -1e9 mask is beyond fp16's range"


def split_heads(projected, parts, num_heads, head_dim):
    """The `parts` tensors (batch, heads, length, head_dim) of a projection (batch, length,
    parts * heads * head_dim): queries, keys and values side by side in its columns.

    A split, not indexing one (parts, batch, heads, length, head_dim) tensor: the gradient of
    a split is one concat, while each index's gradient (StridedSliceGrad) writes a zero tensor
    of the whole projection's size and an AddN sums them, which was a fifth of a step's time
    without XLA (benchmarks/bf16_vs_peer.py). Same columns, same weights."""
    batch, length = ops.shape(projected)[0], ops.shape(projected)[1]
    pieces = ops.split(projected, parts, axis=-1) if parts > 1 else [projected]
    return [ops.transpose(ops.reshape(p, (batch, length, num_heads, head_dim)), (0, 2, 1, 3)) for p in pieces]


def scaled_dot_product(query, key, value, keep, compute_dtype, dropout, training=False):
    """softmax(q·kᵀ / sqrt(d)) · v over the keys `keep` says (bool, broadcastable to
    (batch, heads, query, key); None: all), with the softmax in float32. Queries, keys and
    values are (batch, heads, length, head_dim); returns (batch, query length, hidden)."""
    batch, heads, length, head_dim = (ops.shape(query)[i] for i in range(4))
    query = query * ops.cast(head_dim**-0.5, query.dtype)
    scores = ops.einsum("bhqd,bhkd->bhqk", query, key)  # (batch, heads, query, key)
    # In float32: exp() of fp16 scores overflows past 11, and the mask's large negative must
    # stay far below every real score, which fp16's range (6.5e4) cannot promise. Keeps the
    # cast probabilities only (lean.py).
    weights = masked_softmax(scores, keep, compute_dtype)
    weights = dropout(weights, training=training)
    context = ops.einsum("bhqk,bhkd->bhqd", weights, value)
    return ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (batch, length, heads * head_dim))


@keras.saving.register_keras_serializable(package="amptrain")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Scaled dot-product self-attention over unmasked keys."""

    float32_reason = SOFTMAX_REASON

    def __init__(self, hidden_dim, num_heads, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.dropout = dropout
        # === Layers ===
        self.qkv = keras.layers.Dense(3 * hidden_dim, dtype=self.dtype_policy, name="qkv")
        self.output_dense = keras.layers.Dense(hidden_dim, dtype=self.dtype_policy, name="output")
        self.attention_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.output_dense.build(input_shape)

    def call(self, x, padding_mask=None, training=False):
        query, key, value = split_heads(self.qkv(x), 3, self.num_heads, self.head_dim)
        keep = None if padding_mask is None else ops.cast(padding_mask, "bool")[:, None, None, :]
        context = scaled_dot_product(query, key, value, keep, self.compute_dtype, self.attention_dropout, training)
        return self.output_dense(context)  # (batch, length, hidden)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
        }


@keras.saving.register_keras_serializable(package="amptrain")
class Attention(keras.layers.Layer):
    """Multi-head attention of queries `x` over keys and values made from `context`."""

    float32_reason = SOFTMAX_REASON

    def __init__(self, hidden_dim, num_heads, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.dropout = dropout
        # === Layers ===
        self.query = keras.layers.Dense(hidden_dim, dtype=self.dtype_policy, name="query")
        self.key_value = keras.layers.Dense(2 * hidden_dim, dtype=self.dtype_policy, name="key_value")
        self.output_dense = keras.layers.Dense(hidden_dim, dtype=self.dtype_policy, name="output")
        self.attention_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        for layer in (self.query, self.key_value, self.output_dense):
            layer.build(input_shape)

    def keys_values(self, context):
        """(batch, heads, length, head_dim) keys and values of `context` (batch, length, hidden)."""
        key, value = split_heads(self.key_value(context), 2, self.num_heads, self.head_dim)
        return key, value

    def attend(self, x, key, value, mask, training=False):
        """`mask`: bool, (batch, query length, key length) or broadcastable; True keeps a key."""
        (query,) = split_heads(self.query(x), 1, self.num_heads, self.head_dim)
        context = scaled_dot_product(
            query, key, value, mask[:, None], self.compute_dtype, self.attention_dropout, training
        )
        return self.output_dense(context)

    def call(self, x, context, mask, training=False):
        key, value = self.keys_values(context)
        return self.attend(x, key, value, mask, training)

    def attend_cached(self, x, index, cache_key, cache_value):
        """Self-attention of one position `index` (a scalar tensor) of x (batch, 1, hidden):
        its key and value are written into the caches (batch, heads, max_length, head_dim)
        by a one-hot blend (a shape that never changes: a decoding loop compiles once), and
        it attends to positions 0..index. Returns (output, cache_key, cache_value)."""
        key, value = self.keys_values(x)  # (batch, heads, 1, head_dim)
        max_length = ops.shape(cache_key)[2]
        at_index = ops.cast(ops.arange(max_length) == index, cache_key.dtype)[None, None, :, None]
        cache_key = cache_key * (1 - at_index) + ops.cast(key, cache_key.dtype) * at_index
        cache_value = cache_value * (1 - at_index) + ops.cast(value, cache_value.dtype) * at_index
        seen = (ops.arange(max_length) <= index)[None, None, :]  # (1, 1, max_length)
        return self.attend(x, cache_key, cache_value, seen), cache_key, cache_value

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
        }


def block_arguments(model_config):
    """The keyword arguments every block here takes from a config's `model` section (or a
    namespace of its fields): its sizes, dropout, and whether it is recomputed in the backward
    pass (`model.remat = "blocks"`; a section written before the key says "none")."""
    c = model_config
    return {
        "hidden_dim": c.hidden_dim,
        "num_heads": c.num_heads,
        "intermediate_dim": c.intermediate_dim,
        "dropout": c.dropout,
        "remat": getattr(c, "remat", "none") == "blocks",
    }


@keras.saving.register_keras_serializable(package="amptrain")
class PreNormBlock(keras.layers.Layer):
    """The pre-norm Transformer block of every model here: x + attention(norm(x)); with
    `cross_attention`, then x + cross_attention(norm(x), memory); then x + ffn(norm(x)).

    Pre-norm trains from scratch without a long warm-up and keeps the residual stream
    un-normalised, which is also what lets a half-precision run stay stable.

    `attention`: the self-attention's class (or its registered name): `MultiHeadSelfAttention`
    (the encoder's, over a padding mask (batch, key)), `Attention` (the translator's decoder,
    over a bool mask (batch, query, key)) or a subclass of it (the language model's causal
    one). `attention_name` names it and its norm (`NAME`, `NAME_norm`): the sublayers'
    attribute names are what TensorFlow checkpoints follow.

        encoder = PreNormBlock(64, 4, 128, dtype="mixed_bfloat16")
        decoder = PreNormBlock(64, 4, 128, attention=Attention, attention_name="self_attention",
                               cross_attention=True, dtype="mixed_bfloat16")
        y = decoder(y, self_mask, memory, memory_mask)   # masks: bool (batch, query, key)
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        intermediate_dim,
        dropout=0.0,
        remat=False,
        attention=None,
        attention_name="attention",
        cross_attention=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.remat = remat  # True: its activations recomputed in the backward pass (remat.py)
        if isinstance(attention, str):
            attention = keras.saving.get_registered_object(attention)
        self._attention_class = attention or MultiHeadSelfAttention
        self.attention_name, self.cross = attention_name, cross_attention
        policy = self.dtype_policy
        # === Layers === (created in this order, which the variables' order and seeds follow)
        # LayerNormalization computes its statistics in float32 under mixed policies,
        # so it needs no pinned dtype (lean.py: it keeps its input in the compute dtype).
        norm_name = f"{attention_name}_norm"
        setattr(self, norm_name, LayerNormalization(epsilon=1e-6, dtype=policy, name=norm_name))
        made = self._attention_class(hidden_dim, num_heads, dropout, dtype=policy, name=attention_name)
        setattr(self, attention_name, made)
        if cross_attention:
            self.cross_attention_norm = LayerNormalization(epsilon=1e-6, dtype=policy, name="cross_attention_norm")
            self.cross_attention = Attention(hidden_dim, num_heads, dropout, dtype=policy, name="cross_attention")
        self.ffn_norm = LayerNormalization(epsilon=1e-6, dtype=policy, name="ffn_norm")
        self.ffn_in = keras.layers.Dense(intermediate_dim, activation=gelu, dtype=policy, name="ffn_in")
        self.ffn_out = keras.layers.Dense(hidden_dim, dtype=policy, name="ffn_out")
        self.residual_dropout = Dropout(dropout, dtype=policy)

    @property
    def self_attention_layers(self):
        """(its norm, the self-attention)."""
        return getattr(self, f"{self.attention_name}_norm"), getattr(self, self.attention_name)

    def build(self, input_shape):
        layers = list(self.self_attention_layers)
        if self.cross:
            layers += [self.cross_attention_norm, self.cross_attention]
        for layer in (*layers, self.ffn_norm, self.ffn_in):
            layer.build(input_shape)
        self.ffn_out.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, x, attention_mask=None, memory=None, memory_mask=None, training=False):
        """`attention_mask`: the self-attention's (its class's kind); `memory`, `memory_mask`
        (bool, (batch, 1, memory length)): what the cross-attention reads."""
        if self.remat and training:
            body = lambda x, memory=None: self._body(x, attention_mask, memory, memory_mask, True)  # noqa: E731
            return recomputed(self, body, *((x,) if memory is None else (x, memory)))
        return self._body(x, attention_mask, memory, memory_mask, training)

    def _body(self, x, attention_mask, memory, memory_mask, training):
        norm, attention = self.self_attention_layers
        normed = norm(x)
        if isinstance(attention, MultiHeadSelfAttention):
            attended = attention(normed, padding_mask=attention_mask, training=training)
        else:
            attended = attention(normed, normed, attention_mask, training=training)
        x = x + self.residual_dropout(attended, training=training)
        if self.cross:
            # Called as a layer (not through `attend`), so the audit sees its softmax inside its island.
            attended = self.cross_attention(self.cross_attention_norm(x), memory, memory_mask, training=training)
            x = x + self.residual_dropout(attended, training=training)
        return self._ffn(x, training)

    def _ffn(self, x, training=False):
        transformed = self.ffn_out(self.ffn_in(self.ffn_norm(x)))
        return x + self.residual_dropout(transformed, training=training)  # (batch, length, hidden)

    def step(self, x, index, cache_key, cache_value, memory_key=None, memory_value=None, memory_mask=None):
        """One position `index` (a scalar tensor) of x (batch, 1, hidden): its key and value
        are written into the caches (batch, heads, max_length, head_dim), and it attends
        to positions 0..index (`Attention.attend_cached`), then over the memory's keys and
        values. Returns (output, cache_key, cache_value)."""
        norm, attention = self.self_attention_layers
        attended, cache_key, cache_value = attention.attend_cached(norm(x), index, cache_key, cache_value)
        x = x + attended
        if self.cross:
            x = x + self.cross_attention.attend(self.cross_attention_norm(x), memory_key, memory_value, memory_mask)
        return self._ffn(x), cache_key, cache_value

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "remat": self.remat,
            "attention": keras.saving.get_registered_name(self._attention_class),
            "attention_name": self.attention_name,
            "cross_attention": self.cross,
        }
