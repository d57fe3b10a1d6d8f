"""GPT-2 (`model_type = "gpt2"`): keras-hub's GPT2Backbone, byte-level BPE (`tokenizer.json`),
learned positions, `<|endoftext|>` ends a text and no piece starts one; tied embeddings.

keras-hub builds every dropout at `resid_pdrop` and layer norms at 1e-5 (GPT-2's), and the
feed-forward 4 x n_embd wide (config/pretrained.py refuses another `n_inner`). Its
attention runs the softmax in the compute dtype under a mixed policy with dropout: it is
computed in float32 here (`tasks/language_model/pretrained.py`), as for the encoders.
Positions count from each packed document's start (the layer takes `positions`).
"""

from amptrain.tasks.language_model.families.base import DECODER_PROJECTIONS, CausalFamily, decoder_cached


def run_layer(layer, x, keep, training):
    """keras-hub's TransformerDecoder under amptrain's mask alone (it is causal already)."""
    return layer(x, decoder_attention_mask=keep, use_causal_mask=False, training=training)


FAMILY = CausalFamily(
    model_type="gpt2",
    backbone="GPT2Backbone",
    converter="convert_gpt2",
    run_layer=run_layer,
    run_cached=decoder_cached,
    # Llama's names but no gate: GPT-2's feed-forward is up, GELU, down.
    projections={name: path for name, path in DECODER_PROJECTIONS.items() if name != "gate"},
)
