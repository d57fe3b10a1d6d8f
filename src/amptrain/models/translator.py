"""The encoder-decoder Transformer for translation, with a cached decoder for search.

    model = Translator(source_vocabulary_size=8000, target_vocabulary_size=8000,
                       max_length=64, model_config=config.model, dtype="mixed_bfloat16")
    logits = model(features, training=True)        # teacher forcing: (batch, target length, vocabulary), float32
    memory = model.encode(source_ids, source_mask)  # decoding: the encoder once a sentence
    state = model.start_state(memory, source_mask, max_length)
    logits, state = model.decode_step(token_ids, index, state)  # one new position, cached keys and values

The encoder is the shared one's blocks (pre-norm, float32 softmax); each decoder block
is causal self-attention, cross-attention over the encoder's output and a feed-forward
layer, pre-norm as well. With `model.tie_embeddings` the output projection is the target
token embedding transposed; with a shared vocabulary the source and target pieces share
one embedding too. The output projection, the softmax and the loss run in float32: the
softmax over thousands of pieces is a sum that half precision cannot hold.

Decoding caches every decoder layer's self-attention keys and values in fixed-size
buffers (batch, heads, max_length, head_dim), written at the step's position, and the
cross-attention keys and values of the encoder's output once: a step costs one position,
not the whole prefix, and every shape is fixed, so the search loop compiles under XLA.
"""

import keras
from keras import ops

from amptrain.models.blocks import EncoderBlock, scaled_dot_product


class Attention(keras.layers.Layer):
    """Multi-head attention of queries `x` over keys and values made from `context`."""

    float32_reason = (
        "the masked softmax: exp() of fp16 scores overflows past 11, and the -1e9 mask is beyond fp16's range"
    )

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
        self.attention_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        for layer in (self.query, self.key_value, self.output_dense):
            layer.build(input_shape)

    def keys_values(self, context):
        """(batch, heads, length, head_dim) keys and values of `context` (batch, length, hidden)."""
        batch, length = ops.shape(context)[0], ops.shape(context)[1]
        kv = ops.reshape(self.key_value(context), (batch, length, 2, self.num_heads, self.head_dim))
        kv = ops.transpose(kv, (2, 0, 3, 1, 4))
        return kv[0], kv[1]

    def attend(self, x, key, value, mask, training=False):
        """`mask`: bool, (batch, query length, key length) or broadcastable; True keeps a key."""
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        query = ops.reshape(self.query(x), (batch, length, self.num_heads, self.head_dim))
        query = ops.transpose(query, (0, 2, 1, 3))
        context = scaled_dot_product(
            query, key, value, mask[:, None], self.compute_dtype, self.attention_dropout, training
        )
        return self.output_dense(context)

    def call(self, x, context, mask, training=False):
        key, value = self.keys_values(context)
        return self.attend(x, key, value, mask, training)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
        }


class DecoderBlock(keras.layers.Layer):
    """Pre-norm decoder block: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, hidden_dim, num_heads, intermediate_dim, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        policy = self.dtype_policy
        # === Layers ===
        self.self_attention_norm = keras.layers.LayerNormalization(
            epsilon=1e-6, dtype=policy, name="self_attention_norm"
        )
        self.self_attention = Attention(hidden_dim, num_heads, dropout, dtype=policy, name="self_attention")
        self.cross_attention_norm = keras.layers.LayerNormalization(
            epsilon=1e-6, dtype=policy, name="cross_attention_norm"
        )
        self.cross_attention = Attention(hidden_dim, num_heads, dropout, dtype=policy, name="cross_attention")
        self.ffn_norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy, name="ffn_norm")
        self.ffn_in = keras.layers.Dense(intermediate_dim, activation="gelu", dtype=policy, name="ffn_in")
        self.ffn_out = keras.layers.Dense(hidden_dim, dtype=policy, name="ffn_out")
        self.residual_dropout = keras.layers.Dropout(dropout, dtype=policy)

    def build(self, input_shape):
        for layer in (
            self.self_attention_norm,
            self.self_attention,
            self.cross_attention_norm,
            self.cross_attention,
            self.ffn_norm,
            self.ffn_in,
        ):
            layer.build(input_shape)
        self.ffn_out.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, x, memory, memory_mask, target_mask, training=False):
        """Teacher forcing over a whole target: position i sees positions 0..i only."""
        length = ops.shape(x)[1]
        positions = ops.arange(length)
        causal = positions[:, None] >= positions[None, :]  # (query, key)
        self_mask = ops.logical_and(causal[None], ops.cast(target_mask, "bool")[:, None, :])
        normed = self.self_attention_norm(x)
        x = x + self.residual_dropout(
            self.self_attention(normed, normed, self_mask, training=training), training=training
        )
        # Called as layers (not through `attend`), so the audit sees each softmax inside its island.
        memory_mask = ops.cast(memory_mask, "bool")[:, None, :]
        attended = self.cross_attention(self.cross_attention_norm(x), memory, memory_mask, training=training)
        x = x + self.residual_dropout(attended, training=training)
        return self._ffn(x, training)

    def _ffn(self, x, training=False):
        transformed = self.ffn_out(self.ffn_in(self.ffn_norm(x)))
        return x + self.residual_dropout(transformed, training=training)

    def step(self, x, index, cache_key, cache_value, memory_key, memory_value, memory_mask):
        """One position `index` (a scalar tensor) of x (batch, 1, hidden): its key and value
        are written into the caches (batch, heads, max_length, head_dim), and it attends
        to positions 0..index. Returns (output, cache_key, cache_value)."""
        normed = self.self_attention_norm(x)
        key, value = self.self_attention.keys_values(normed)  # (batch, heads, 1, head_dim)
        max_length = ops.shape(cache_key)[2]
        at_index = ops.cast(ops.arange(max_length) == index, cache_key.dtype)[None, None, :, None]
        cache_key = cache_key * (1 - at_index) + key * at_index
        cache_value = cache_value * (1 - at_index) + value * at_index
        seen = (ops.arange(max_length) <= index)[None, None, :]  # (1, 1, max_length)
        x = x + self.self_attention.attend(normed, cache_key, cache_value, seen)
        x = x + self.cross_attention.attend(self.cross_attention_norm(x), memory_key, memory_value, memory_mask)
        return self._ffn(x), cache_key, cache_value

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
        }


class OutputProjection(keras.layers.Layer):
    """Logits over the target vocabulary, in float32: the target embedding transposed (tied)
    or a kernel of its own, plus a bias."""

    float32_reason = "the logits feed a softmax over the whole target vocabulary, a sum half precision cannot hold"

    def __init__(self, vocabulary_size, tied_embedding=None, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.tied_embedding = tied_embedding

    def build(self, input_shape):
        if self.tied_embedding is None:
            self.kernel = self.add_weight(
                shape=(input_shape[-1], self.vocabulary_size), initializer="glorot_uniform", name="kernel"
            )
        self.bias = self.add_weight(shape=(self.vocabulary_size,), initializer="zeros", name="bias")

    def call(self, x):
        x = ops.cast(x, "float32")
        if self.tied_embedding is not None:
            logits = ops.matmul(x, ops.transpose(ops.cast(self.tied_embedding.embeddings, "float32")))
        else:
            logits = ops.matmul(x, ops.cast(self.kernel, "float32"))
        return logits + ops.cast(self.bias, "float32")


class Translator(keras.Model):
    """The encoder-decoder. Features: source_ids, source_mask, target_ids, target_mask
    (the decoder's input: the start piece, then the target shifted right)."""

    def __init__(
        self,
        source_vocabulary_size,
        target_vocabulary_size,
        max_length,
        model_config,
        dtype,
        shared_embedding=False,
        **kwargs,
    ):
        super().__init__(name="translator", **kwargs)
        c = model_config
        self.max_length = max_length
        self.hidden_dim = c.hidden_dim
        self.num_heads = c.num_heads
        self.target_vocabulary_size = target_vocabulary_size
        # === Layers ===
        self.source_embedding = keras.layers.Embedding(
            source_vocabulary_size, c.hidden_dim, dtype=dtype, name="source_embedding"
        )
        self.target_embedding = (
            self.source_embedding
            if shared_embedding
            else keras.layers.Embedding(target_vocabulary_size, c.hidden_dim, dtype=dtype, name="target_embedding")
        )
        self.source_positions = keras.layers.Embedding(max_length, c.hidden_dim, dtype=dtype, name="source_positions")
        self.target_positions = keras.layers.Embedding(max_length, c.hidden_dim, dtype=dtype, name="target_positions")
        self.embedding_dropout = keras.layers.Dropout(c.dropout, dtype=dtype)
        # One attribute a block, not a list: TensorFlow checkpoints follow attributes, and
        # a list of layers on a Keras 3 model is not saved (found by a restored model that
        # decoded garbage: its checkpoint held the embeddings and norms, and no block).
        self.num_encoder_layers = c.num_layers
        self.num_decoder_layers = c.num_decoder_layers or c.num_layers
        for i in range(self.num_encoder_layers):
            setattr(
                self,
                f"encoder_{i}",
                EncoderBlock(
                    c.hidden_dim, c.num_heads, c.intermediate_dim, c.dropout, dtype=dtype, name=f"encoder_{i}"
                ),
            )
        self.encoder_norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype, name="encoder_norm")
        for i in range(self.num_decoder_layers):
            setattr(
                self,
                f"decoder_{i}",
                DecoderBlock(
                    c.hidden_dim, c.num_heads, c.intermediate_dim, c.dropout, dtype=dtype, name=f"decoder_{i}"
                ),
            )
        self.decoder_norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype, name="decoder_norm")
        self.output_projection = OutputProjection(
            target_vocabulary_size, self.target_embedding if c.tie_embeddings else None, dtype="float32", name="logits"
        )

    @property
    def encoder_blocks(self):
        return [getattr(self, f"encoder_{i}") for i in range(self.num_encoder_layers)]

    @property
    def decoder_blocks(self):
        return [getattr(self, f"decoder_{i}") for i in range(self.num_decoder_layers)]

    def build_all(self, length=8):
        """Creates every variable (one forward pass on zeros)."""
        ids = ops.zeros((1, length), "int32")
        mask = ops.ones((1, length), "bool")
        self({"source_ids": ids, "source_mask": mask, "target_ids": ids, "target_mask": mask})
        return self

    def _embed(self, embedding, positions, ids, training=False):
        length = ops.shape(ids)[1]
        x = embedding(ids) + positions(ops.arange(length))[None]
        return self.embedding_dropout(x, training=training)

    def encode(self, source_ids, source_mask, training=False):
        x = self._embed(self.source_embedding, self.source_positions, source_ids, training)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=source_mask, training=training)
        return self.encoder_norm(x)  # (batch, source length, hidden)

    def call(self, features, training=False):
        memory = self.encode(features["source_ids"], features["source_mask"], training)
        x = self._embed(self.target_embedding, self.target_positions, features["target_ids"], training)
        for block in self.decoder_blocks:
            x = block(x, memory, features["source_mask"], features["target_mask"], training=training)
        return self.output_projection(self.decoder_norm(x))  # (batch, target length, vocabulary), float32

    # === Decoding, one position a step ===

    def start_state(self, memory, source_mask, max_length):
        """The decoder's state before the first step: each layer's cross-attention keys and
        values of `memory` and empty self-attention caches of `max_length` positions."""
        batch = ops.shape(memory)[0]
        head_dim = self.hidden_dim // self.num_heads
        state = {"memory_mask": ops.cast(source_mask, "bool")[:, None, :], "layers": []}
        for block in self.decoder_blocks:
            memory_key, memory_value = block.cross_attention.keys_values(memory)
            empty = ops.zeros((batch, self.num_heads, max_length, head_dim), memory_key.dtype)
            state["layers"].append(
                {"key": empty, "value": empty, "memory_key": memory_key, "memory_value": memory_value}
            )
        return state

    def decode_step(self, token_ids, index, state):
        """Logits (batch, vocabulary) of the piece after `token_ids` (batch,), which stand at
        position `index`; returns them with the state holding this position's keys and values."""
        x = self.target_embedding(token_ids[:, None]) + self.target_positions(ops.reshape(index, (1,)))[None]
        layers = []
        for block, cache in zip(self.decoder_blocks, state["layers"]):
            x, key, value = block.step(
                x, index, cache["key"], cache["value"], cache["memory_key"], cache["memory_value"], state["memory_mask"]
            )
            layers.append({**cache, "key": key, "value": value})
        logits = self.output_projection(self.decoder_norm(x))[:, 0]
        return logits, {"memory_mask": state["memory_mask"], "layers": layers}
