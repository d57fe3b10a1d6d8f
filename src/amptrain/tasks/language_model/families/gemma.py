"""Gemma (`model_type = "gemma"`): keras-hub's GemmaBackbone, SentencePiece-made BPE with
byte fallback (`tokenizer.json`; `<bos>` starts a text, `<eos>` ends one), token embeddings
times sqrt(hidden), RMS norms of (1 + scale), GeGLU with the tanh GELU, tied embeddings.

keras-hub's decoder block takes no attention mask of its own: `run_layer` is its body with
amptrain's (causal and same-document). Its RMS norm epsilon (1e-6), RoPE base (10,000) and
tanh GELU are fixed, as Gemma's are; a folder that says otherwise is refused when it is
read (config/families.py), as GPT-2's, Llama's and Qwen2's settings keras-hub ignores are.
"""

import keras

from amptrain.tasks.language_model.families.base import CausalFamily


def run_layer(layer, x, keep, training):
    """keras-hub's GemmaDecoderBlock.call, with `keep` as the attention mask."""
    normed = layer.pre_attention_norm(x)
    attention = layer.attention(normed, attention_mask=keep, training=training)
    if layer.use_post_attention_norm:
        attention = layer.post_attention_norm(attention)
    if layer.dropout:
        attention = layer.attention_dropout(attention, training=training)
    attended = x + attention
    normed = layer.pre_ffw_norm(attended)
    gated = keras.activations.gelu(layer.gating_ffw(normed), approximate=True) * layer.gating_ffw_2(normed)
    x = layer.ffw_linear(gated)
    if layer.use_post_ffw_norm:
        x = layer.post_ffw_norm(x)
    return x + attended


def run_cached(layer, x, cache, index):
    return layer(x, cache=cache, cache_update_index=index)


FAMILY = CausalFamily(
    model_type="gemma",
    backbone="GemmaBackbone",
    converter="convert_gemma",
    embedding_scale=True,
    run_layer=run_layer,
    run_cached=run_cached,
    projections={
        "query": "attention.query_dense",
        "key": "attention.key_dense",
        "value": "attention.value_dense",
        "output": "attention.output_dense",
        "gate": "gating_ffw",
        "up": "gating_ffw_2",
        "down": "ffw_linear",
    },
)
