"""GPT-2 (`model_type = "gpt2"`): keras-hub's GPT2Backbone, byte-level BPE (`tokenizer.json`),
learned positions, `<|endoftext|>` ends a text and no piece starts one; tied embeddings.

keras-hub builds every dropout at `resid_pdrop` and layer norms at 1e-5 (GPT-2's), and the
feed-forward 4 x n_embd wide (config/pretrained.py refuses another `n_inner`). Its
attention runs the softmax in the compute dtype under a mixed policy with dropout: it is
computed in float32 here (`tasks/language_model/pretrained.py`), as for the encoders.
Positions count from each packed document's start (the layer takes `positions`).
"""

from amptrain.models.families.base import CausalFamily


def run_layer(layer, x, keep, training):
    """keras-hub's TransformerDecoder under amptrain's mask alone (it is causal already)."""
    return layer(x, decoder_attention_mask=keep, use_causal_mask=False, training=training)


def run_cached(layer, x, cache, index):
    return layer(x, self_attention_cache=cache, self_attention_cache_update_index=index)


FAMILY = CausalFamily(
    model_type="gpt2",
    backbone="GPT2Backbone",
    converter="convert_gpt2",
    run_layer=run_layer,
    run_cached=run_cached,
    projections={
        "query": "_self_attention_layer._query_dense",
        "key": "_self_attention_layer._key_dense",
        "value": "_self_attention_layer._value_dense",
        "output": "_self_attention_layer._output_dense",
        "up": "_feedforward_intermediate_dense",
        "down": "_feedforward_output_dense",
    },
)
