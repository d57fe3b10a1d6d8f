"""Llama 3 (`model_type = "llama"`): keras-hub's Llama3Backbone, byte-level BPE in one
`tokenizer.json` (`<|begin_of_text|>` starts a text, `<|end_of_text|>` ends one), RoPE,
grouped-query attention, SwiGLU; tied or not as config.json says.

Corrected: keras-hub's converter builds every RMS norm at 1e-6 (Llama 3's is 1e-5:
`rms_norm_eps`), and reads the llama3 RoPE scaling from `rope_scaling` only, where
`transformers` 5 writes it into `rope_parameters` (without it positions beyond the original
length rotate otherwise); both are passed to the backbone from config.json here.
"""

from amptrain.tasks.language_model.families.base import (
    DECODER_PROJECTIONS,
    CausalFamily,
    decoder_cached,
    llama_layer,
    llama_shared,
)


def backbone_arguments(config):
    arguments = {"layer_norm_epsilon": float(config.get("rms_norm_eps", 1e-5))}
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or (parameters if parameters.get("rope_type") == "llama3" else None)
    if scaling:
        arguments.update(
            rope_frequency_adjustment_factor=scaling["factor"],
            rope_low_freq_factor=scaling["low_freq_factor"],
            rope_high_freq_factor=scaling["high_freq_factor"],
            rope_pretraining_sequence_length=scaling["original_max_position_embeddings"],
        )
    return arguments


FAMILY = CausalFamily(
    model_type="llama",
    backbone="Llama3Backbone",
    converter="convert_llama3",
    backbone_arguments=backbone_arguments,
    run_layer=llama_layer,
    shared=llama_shared,
    run_cached=decoder_cached,
    lean_decoding=True,
    projections=DECODER_PROJECTIONS,
)
