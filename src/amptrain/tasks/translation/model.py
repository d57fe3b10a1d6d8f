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

The model round-trips through its config (`Translator.from_config(model.get_config())`,
`model.save("x.keras")` and `keras.saving.load_model`): the config holds plain values
(the model config as a dict, the policy's name), and the rebuilt translator shares and
ties its embeddings again; the output projection's own config says only that it is tied.
"""

from types import SimpleNamespace

import keras
from keras import ops

from amptrain.models.blocks import Attention, PreNormBlock, block_arguments
from amptrain.models.dropout import Dropout
from amptrain.models.lean import LayerNormalization

# A decoder block: causal self-attention (a mask (batch, query, key)), then attention over the encoder's output.
DECODER = {"attention": Attention, "attention_name": "self_attention", "cross_attention": True}


@keras.saving.register_keras_serializable(package="amptrain")
class OutputProjection(keras.layers.Layer):
    """Logits over the target vocabulary, in float32: the target embedding transposed (tied)
    or a kernel of its own, plus a bias.

    A tied projection is given its embedding by its owner (`tie_to`, before it is built).
    Its config says only that it is tied: the embedding is a layer of the owner, saved
    with the owner, and the owner (the Translator, with `tie_embeddings` in its own
    config) ties them again when it is rebuilt from its config."""

    float32_reason = "the logits feed a softmax over the whole target vocabulary, a sum half precision cannot hold"

    def __init__(self, vocabulary_size, tied=False, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.tied = tied
        self.tied_embedding = None

    def tie_to(self, embedding):
        """Uses `embedding` (a keras.layers.Embedding) transposed as the kernel."""
        self.tied_embedding = embedding

    def build(self, input_shape):
        if self.tied and self.tied_embedding is None:
            raise ValueError(f"{self.name}: a tied OutputProjection is built after its owner calls tie_to(embedding)")
        if not self.tied:
            self.kernel = self.add_weight(
                shape=(input_shape[-1], self.vocabulary_size), initializer="glorot_uniform", name="kernel"
            )
        self.bias = self.add_weight(shape=(self.vocabulary_size,), initializer="zeros", name="bias")

    def call(self, x):
        x = ops.cast(x, "float32")
        if self.tied:
            logits = ops.matmul(x, ops.transpose(ops.cast(self.tied_embedding.embeddings, "float32")))
        else:
            logits = ops.matmul(x, ops.cast(self.kernel, "float32"))
        return logits + ops.cast(self.bias, "float32")

    def matmul_parameters(self):
        """The weights multiplied once a token (`hardware/flops.py` counts them)."""
        kernel = self.tied_embedding.embeddings if self.tied else self.kernel
        return int(kernel.shape[0]) * int(kernel.shape[1])

    def get_config(self):
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size, "tied": self.tied}


@keras.saving.register_keras_serializable(package="amptrain")
class Translator(keras.Model):
    """The encoder-decoder. Features: source_ids, source_mask, target_ids, target_mask
    (the decoder's input: the start piece, then the target shifted right).

    `model_config`: the config's `model` section (or a dict of its fields, as in
    `get_config`); `dtype`: the policy its layers are built with (the model object itself
    keeps Keras's default policy, as it always has; its config's "dtype" is the layers')."""

    encoder_decoder = True  # a token is half a source-target pair (`hardware/flops.py`)

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
        kwargs.setdefault("name", "translator")
        super().__init__(**kwargs)
        c = SimpleNamespace(**model_config) if isinstance(model_config, dict) else model_config
        self.source_vocabulary_size = source_vocabulary_size
        self.max_length = max_length
        self.hidden_dim = c.hidden_dim
        self.num_heads = c.num_heads
        self.intermediate_dim = c.intermediate_dim
        self.dropout = c.dropout
        self.tie_embeddings = c.tie_embeddings
        self.target_vocabulary_size = target_vocabulary_size
        self.shared_embedding = shared_embedding
        self.layers_dtype = keras.dtype_policies.get(dtype).name
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
        self.embedding_dropout = Dropout(c.dropout, dtype=dtype)
        self._add_blocks(c, dtype)
        self.decoder_norm = LayerNormalization(epsilon=1e-6, dtype=dtype, name="decoder_norm")
        self.output_projection = OutputProjection(
            target_vocabulary_size, tied=c.tie_embeddings, dtype="float32", name="logits"
        )
        if c.tie_embeddings:
            self.output_projection.tie_to(self.target_embedding)

    def _add_blocks(self, c, dtype):
        """The encoder blocks, the encoder's final norm and the decoder blocks."""
        # One attribute a block, not a list: TensorFlow checkpoints follow attributes, and
        # a list of layers on a Keras 3 model is not saved (found by a restored model that
        # decoded garbage: its checkpoint held the embeddings and norms, and no block).
        self.num_encoder_layers = c.num_layers
        self.num_decoder_layers = c.num_decoder_layers or c.num_layers
        self.remat = getattr(c, "remat", "none")  # "blocks": each block recomputed in the backward pass
        for i in range(self.num_encoder_layers):
            setattr(self, f"encoder_{i}", PreNormBlock(**block_arguments(c), dtype=dtype, name=f"encoder_{i}"))
        self.encoder_norm = LayerNormalization(epsilon=1e-6, dtype=dtype, name="encoder_norm")
        for i in range(self.num_decoder_layers):
            decoder = PreNormBlock(**DECODER, **block_arguments(c), dtype=dtype, name=f"decoder_{i}")
            setattr(self, f"decoder_{i}", decoder)

    def get_config(self):
        """Plain values only: `Translator.from_config` (and a `.keras` file) rebuilds the
        same layers, the shared and tied embeddings shared and tied again."""
        model_config = {
            "num_layers": self.num_encoder_layers,
            "num_decoder_layers": self.num_decoder_layers,
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "tie_embeddings": self.tie_embeddings,
            "remat": self.remat,
        }
        return {
            "name": self.name,
            "trainable": self.trainable,
            "source_vocabulary_size": self.source_vocabulary_size,
            "target_vocabulary_size": self.target_vocabulary_size,
            "max_length": self.max_length,
            "model_config": model_config,
            "dtype": self.layers_dtype,
            "shared_embedding": self.shared_embedding,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def build_from_config(self, config):
        """A loaded translator creates its variables as a new one does (`build_all`)."""
        self.build_all(min(8, self.max_length))

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
            x = block(x, attention_mask=source_mask, training=training)
        return self.encoder_norm(x)  # (batch, source length, hidden)

    def call(self, features, training=False):
        memory = self.encode(features["source_ids"], features["source_mask"], training)
        x = self._embed(self.target_embedding, self.target_positions, features["target_ids"], training)
        # Teacher forcing over a whole target: position i sees positions 0..i only.
        positions = ops.arange(ops.shape(x)[1])
        causal = positions[:, None] >= positions[None, :]  # (query, key)
        self_mask = ops.logical_and(causal[None], ops.cast(features["target_mask"], "bool")[:, None, :])
        memory_mask = ops.cast(features["source_mask"], "bool")[:, None, :]
        for block in self.decoder_blocks:
            x = block(x, self_mask, memory, memory_mask, training=training)
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
