"""A pretrained causal language model (`model.pretrained`: GPT-2, Llama 3, Qwen2, Gemma) with
the surface of `model.LanguageModel`, so the task trains, scores, generates and exports it
the same way.

    model = PretrainedLanguageModel(checkpoint, max_length=256, dropout=0.0, dtype="mixed_bfloat16")
    model = PretrainedLanguageModel(checkpoint, 256, 0.0, "mixed_bfloat16", base_weights="int8")  # LoRA's base
    loss = model({"token_ids": ..., "segment_ids": ..., "positions": ..., "labels": ...}, training=True)
    logits, caches = model.step(token_ids, index, model.empty_caches(batch, length))

The layers are keras-hub's backbone of the checkpoint's family, its weights converted from
the folder (models/families/). Packed documents attend within themselves: each decoder
layer runs on amptrain's mask (causal and same-document), through the family's `run_layer`;
RoPE is relative, so a document packed after another scores as it would alone, and GPT-2's
learned positions count from each document's start. Generation runs a position at a time
over a cache of each layer: Llama's and Qwen2's lean (`families/decoding.py`), GPT-2's and
Gemma's through keras-hub's own cached call.
The logits and the loss are the float32 island of `model.TiedLogits`, over the tied table
or the untied output layer.
"""

import keras
from keras import ops

from amptrain.models.islands import float32_island
from amptrain.models.remat import recomputed
from amptrain.tasks.language_model.base_weights import load_base
from amptrain.tasks.language_model.families import decoding, family_of
from amptrain.tasks.language_model.model import TiedLogits

BACKBONE_NAME = "pretrained_decoder"


class PretrainedLanguageModel(keras.Model):
    def __init__(self, checkpoint, max_length, dropout, dtype, base_weights="float32", remat="none", **kwargs):
        kwargs.setdefault("name", "pretrained_language_model")
        super().__init__(**kwargs)
        self.family = family_of(checkpoint)
        self.max_length = max_length
        self.remat = remat  # "blocks": each decoder layer recomputed in the backward pass
        self.layers_dtype = keras.dtype_policies.get(dtype).name
        options = {"dropout": dropout, "name": BACKBONE_NAME}
        self.backbone = load_base(self.family, checkpoint.path, base_weights, dtype, **options)
        if self.family.model_type == "gpt2":
            from amptrain.models.pretrained import Float32Softmax

            for layer in self.backbone.transformer_layers:
                # Keras' MultiHeadAttention builds its softmax under the layer's policy.
                layer._self_attention_layer._softmax.__class__ = Float32Softmax
        logits = TiedLogits(self.backbone.token_embedding, dtype="float32", name="logits")
        self.logits = float32_island(logits, "the logits feed a softmax over the vocabulary and the loss")
        self.logits.build((None, None, self.backbone.hidden_dim))

    def checkpoint_view(self):
        """What the run's checkpoints hold of this model: all of it, or with adapters
        (`lora.py`) the adapters and the base weights' hash (`base_weights`, set by the task)."""
        if not getattr(self, "lora", None):
            return self
        if getattr(self, "_view", None) is None:
            from amptrain.tasks.language_model.lora import checkpoint_view

            self._view = checkpoint_view(self, getattr(self, "base_weights", ""))
        return self._view

    @property
    def token_embedding(self):
        return self.backbone.token_embedding

    @property
    def blocks(self):
        return list(self.backbone.transformer_layers)

    def build(self, input_shape=None):
        self.built = True

    def _embed(self, ids, positions=None, start=None, training=False):
        b = self.backbone
        x = b.token_embedding(ids)
        if self.family.embedding_scale:
            x = x * ops.cast(ops.sqrt(float(b.hidden_dim)), x.dtype)
        if hasattr(b, "position_embedding"):  # GPT-2's learned positions
            if positions is None:
                x = x + b.position_embedding(x, start_index=start)
            else:
                x = x + b.position_embedding(x, positions=positions)
            x = b.embeddings_dropout(x, training=training)
        return x

    def call(self, features, training=False):
        ids, segments = features["token_ids"], features["segment_ids"]
        x = self._embed(ids, positions=features["positions"], training=training)
        order = ops.arange(ops.shape(ids)[1])
        causal = (order[:, None] >= order[None, :])[None]
        keep = ops.logical_and(causal, ops.equal(segments[:, :, None], segments[:, None, :]))
        shared = self.family.shared(self.blocks[0], x) if self.family.shared else {}
        for layer in self.blocks:
            if training and self.remat == "blocks":
                x = recomputed(layer, lambda x, layer=layer: self.family.run_layer(layer, x, keep, True, **shared), x)
            else:
                x = self.family.run_layer(layer, x, keep, training, **shared)
        states = self.backbone.layer_norm(x)
        if "labels" in features:
            return self.logits(states, labels=features["labels"], training=training)
        return self.logits(states)

    def empty_caches(self, batch, length):
        """Zero caches of every layer: (keys, values) of (batch, key-value heads, length, head
        size) where the family decodes lean (`families/decoding.py`), else keras-hub's layout
        (batch, 2, length, key-value heads, head size)."""
        dtype = keras.dtype_policies.get(self.layers_dtype).compute_dtype
        if self.family.lean_decoding:
            return [decoding.empty_cache(layer, batch, length, dtype) for layer in self.blocks]
        b = self.backbone
        heads = getattr(b, "num_key_value_heads", None) or b.num_heads
        head_dim = getattr(b, "head_dim", None) or b.hidden_dim // getattr(b, "num_query_heads", heads)
        return [ops.zeros((batch, 2, length, heads, head_dim), dtype) for _ in self.blocks]

    def decoding_weights(self):
        """What `step` reads of the projections, made once a generation: their kernels with the
        adapters merged, in the compute dtype (None where the family decodes through keras-hub)."""
        if not self.family.lean_decoding:
            return None
        dtype = keras.dtype_policies.get(self.layers_dtype).compute_dtype
        return decoding.decoding_weights(self.blocks, self.family.projections, dtype)

    def decoding_bytes(self):
        """What `decoding_weights` holds, counted from the shapes."""
        if not self.family.lean_decoding:
            return 0
        dtype = keras.dtype_policies.get(self.layers_dtype).compute_dtype
        return decoding.decoding_bytes(self.blocks, self.family.projections, dtype)

    def step(self, token_ids, index, caches, weights=None):
        """(logits (batch, vocabulary) of the piece after position `index`, the caches with it);
        `weights`: `decoding_weights()`, made here when not given."""
        if not self.family.lean_decoding:
            x = self._embed(token_ids[:, None], start=index)
            updated = []
            for layer, cache in zip(self.blocks, caches):
                x, cache = self.family.run_cached(layer, x, cache, index)
                updated.append(cache)
            return self.logits(self.backbone.layer_norm(x))[:, 0], updated
        x, updated = self._decode(token_ids[:, None], index, caches, weights)
        return self.logits(self.backbone.layer_norm(x))[:, 0], updated

    def prefill(self, token_ids, caches, weights):
        """The caches with positions 0 to n - 1 of `token_ids` (batch, n) written in, all at once
        (what `step` would write one by one); Llama's and Qwen2's (`weights` not None) only."""
        return self._decode(token_ids, 0, caches, weights)[1]

    def _decode(self, token_ids, index, caches, weights):
        weights = weights if weights is not None else self.decoding_weights()
        dtype = keras.dtype_policies.get(self.layers_dtype).compute_dtype
        table = self.backbone.token_embedding.embeddings
        x = ops.cast(ops.take(table, token_ids, axis=0), dtype)  # the rows cast, not the whole table
        updated = []
        for layer, layer_weights, (keys, values) in zip(self.blocks, weights, caches):
            x, keys, values = decoding.decoder_step(layer, layer_weights, x, keys, values, index)
            updated.append((keys, values))
        return x, updated
