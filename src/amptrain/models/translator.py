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

from amptrain.models.blocks import DecoderBlock, EncoderBlock


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
