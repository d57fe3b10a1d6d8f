"""A decoder-only Transformer: pre-norm blocks (`models.blocks.PreNormBlock`) of causal
self-attention, learned positions, and input and output embeddings tied.

    model = LanguageModel(vocabulary_size=4096, max_length=256, model_config=config.model,
                          dtype="mixed_bfloat16")
    logits = model({"token_ids": ids, "segment_ids": segments, "positions": positions})
    loss = model({..., "labels": next_ids}, training=True)  # summed cross-entropy, float32
    logits, caches = model.step(token_ids, index, caches)   # one position, keys and values cached

A block of packed documents attends within each document only: position q sees key k when
k <= q and both carry the same segment id, and positions count from each document's start,
so a document's losses are the same packed with others or alone. The logits are a float32
island (the tied embedding's transpose, in float32): the softmax over the vocabulary and
the loss are unsafe in half precision. Given labels, the model returns the cross-entropy
instead, made a chunk of logits at a time (`cross_entropy.py`): the full logits in float32
would be the training step's largest tensor.
"""

from types import SimpleNamespace

import keras
from keras import ops

from amptrain.models.blocks import Attention, PreNormBlock, block_arguments
from amptrain.models.dropout import Dropout
from amptrain.models.islands import float32_island
from amptrain.models.lean import LayerNormalization
from amptrain.tasks.language_model.cross_entropy import summed_cross_entropy, token_cross_entropy


@keras.saving.register_keras_serializable(package="amptrain")
class CausalSelfAttention(Attention):
    """`blocks.Attention` of a sequence over itself under a causal mask: a position attends to
    itself and the positions before it, so on average to half the keys (`hardware/flops.py`
    counts half the attention's width)."""

    causal = True


@keras.saving.register_keras_serializable(package="amptrain")
class TiedLogits(keras.layers.Layer):
    """Logits over the vocabulary: the states times the token embedding's transpose, in float32
    (or times a pretrained model's own output table: a keras-hub ReversibleEmbedding untied)."""

    float32_reason = "the logits feed a softmax over the whole vocabulary, a sum half precision cannot hold"

    def __init__(self, embedding=None, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x, labels=None, training=False):
        """The logits (batch, length, vocabulary); given `labels` (batch, length; negative where
        not scored), the cross-entropy instead, a chunk of logits at a time
        (`cross_entropy.py`): summed over the batch when training, else of every position."""
        # the gradient's products in the network's bfloat16 (its states' gradient goes back
        # into bfloat16 layers anyway); float16 and float32 networks keep them in float32
        products = "bfloat16" if self.embedding.compute_dtype == "bfloat16" else "float32"
        table = ops.cast(self.table(), "float32")
        x = ops.cast(x, "float32")
        if labels is None:
            return ops.matmul(x, ops.transpose(table))
        rows = ops.reshape(x, (-1, ops.shape(x)[-1]))
        flat = ops.reshape(labels, (-1,))
        if training:
            return summed_cross_entropy(rows, table, flat, self.table_trainable(), products)
        return ops.reshape(token_cross_entropy(rows, table, flat), ops.shape(labels))

    def table(self):
        """(vocabulary, hidden): the token embedding, or the untied output table's transpose."""
        if getattr(self.embedding, "tie_weights", True):
            return self.embedding.embeddings
        return ops.transpose(self.embedding.reverse_embeddings)

    def table_trainable(self):
        """Whether the table is trained (LoRA freezes it: its gradient is then never made)."""
        if getattr(self.embedding, "tie_weights", True):
            return self.embedding.embeddings.trainable
        return self.embedding.reverse_embeddings.trainable

    def matmul_parameters(self):
        """The weights multiplied once a token (`hardware/flops.py` counts them)."""
        shape = self.embedding.embeddings.shape
        return int(shape[0]) * int(shape[1])

    def frozen_matmul_parameters(self):
        """Those of them with no gradient (`hardware/flops.py` counts them 4 a token, not 6)."""
        return 0 if self.table_trainable() else self.matmul_parameters()


@keras.saving.register_keras_serializable(package="amptrain")
class LanguageModel(keras.Model):
    """Features: token_ids, segment_ids (a document's number within its block; -1 pads) and
    positions (counted from each document's start), each (batch, length), and optionally
    labels (the next pieces; negative where not scored). The logits (batch, length,
    vocabulary) in float32; with labels, the cross-entropy made without them (`TiedLogits`).
    `model_config`: the config's `model` section or a dict of its fields."""

    def __init__(self, vocabulary_size, max_length, model_config, dtype, **kwargs):
        kwargs.setdefault("name", "language_model")
        super().__init__(**kwargs)
        c = SimpleNamespace(**model_config) if isinstance(model_config, dict) else model_config
        self.vocabulary_size, self.max_length = vocabulary_size, max_length
        self.hidden_dim, self.num_heads, self.intermediate_dim = c.hidden_dim, c.num_heads, c.intermediate_dim
        self.num_layers, self.dropout = c.num_layers, c.dropout
        self.remat = getattr(c, "remat", "none")  # "blocks": each block recomputed in the backward pass
        self.layers_dtype = keras.dtype_policies.get(dtype).name
        self.token_embedding = keras.layers.Embedding(vocabulary_size, c.hidden_dim, dtype=dtype, name="tokens")
        self.position_embedding = keras.layers.Embedding(max_length, c.hidden_dim, dtype=dtype, name="positions")
        self.embedding_dropout = Dropout(c.dropout, dtype=dtype)
        # One attribute a block: TensorFlow checkpoints follow attributes, not a list of layers.
        for i in range(c.num_layers):
            block = PreNormBlock(**block_arguments(c), attention=CausalSelfAttention, dtype=dtype, name=f"block_{i}")
            setattr(self, f"block_{i}", block)
        self.final_norm = LayerNormalization(epsilon=1e-6, dtype=dtype, name="final_norm")
        logits = TiedLogits(self.token_embedding, dtype="float32", name="logits")
        self.logits = float32_island(logits, "the logits feed a softmax over the vocabulary and the loss")

    @property
    def blocks(self):
        return [getattr(self, f"block_{i}") for i in range(self.num_layers)]

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_dim)
        self.token_embedding.build((None, None))
        self.position_embedding.build((None, None))
        for block in self.blocks:
            block.build(shape)
        self.final_norm.build(shape)
        self.logits.build(shape)
        self.built = True

    def call(self, features, training=False):
        ids, segments, positions = features["token_ids"], features["segment_ids"], features["positions"]
        x = self.token_embedding(ids) + self.position_embedding(positions)
        x = self.embedding_dropout(x, training=training)
        length = ops.shape(ids)[1]
        order = ops.arange(length)
        causal = (order[:, None] >= order[None, :])[None]  # (1, query, key)
        same = ops.equal(segments[:, :, None], segments[:, None, :])  # (batch, query, key)
        keep = ops.logical_and(causal, same)
        for block in self.blocks:
            x = block(x, keep, training=training)
        states = self.final_norm(x)
        if "labels" in features:  # the loss, as Hugging Face's models give it for `labels`
            return self.logits(states, labels=features["labels"], training=training)
        return self.logits(states)  # (batch, length, vocabulary) float32

    def empty_caches(self, batch, length):
        """Zero key and value caches of every block, (batch, heads, length, head_dim) each."""
        head_dim = self.hidden_dim // self.num_heads
        dtype = keras.dtype_policies.get(self.layers_dtype).compute_dtype
        shape = (batch, self.num_heads, length, head_dim)
        return [(ops.zeros(shape, dtype), ops.zeros(shape, dtype)) for _ in self.blocks]

    def decoding_weights(self):
        """What `step` needs made once a generation: nothing (the blocks read their own weights)."""
        return None

    def decoding_bytes(self):
        return 0

    def step(self, token_ids, index, caches, weights=None):
        """(logits (batch, vocabulary) of the piece after position `index`, the caches with it):
        `token_ids` (batch,) is the piece at `index`, one document from position 0."""
        x = self.token_embedding(token_ids[:, None]) + self.position_embedding(ops.reshape(index, (1, 1)))
        updated = []
        for block, (key, value) in zip(self.blocks, caches):
            x, key, value = block.step(x, index, key, value)
            updated.append((key, value))
        return self.logits(self.final_norm(x))[:, 0], updated

    def get_config(self):
        return {
            "name": self.name,
            "vocabulary_size": self.vocabulary_size,
            "max_length": self.max_length,
            "dtype": self.layers_dtype,
            "model_config": {
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "remat": self.remat,
            },
        }
