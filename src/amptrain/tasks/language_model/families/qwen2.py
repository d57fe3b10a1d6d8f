"""Qwen2 (`model_type = "qwen2"`): keras-hub's QwenBackbone, byte-level BPE (`tokenizer.json`,
one digit a piece), `<|endoftext|>` ends a text and no piece starts one; RoPE, grouped-query
attention with biases on the query, key and value; tied or not as config.json says.

keras-hub's converter reads `rms_norm_eps` and the RoPE base; it never turns on the sliding
window (the backbone's argument has another name), so a folder asking for one
(`use_sliding_window`) is refused when it is read (config/families.py).
"""

from amptrain.tasks.language_model.families.base import (
    DECODER_PROJECTIONS,
    CausalFamily,
    decoder_cached,
    llama_layer,
    llama_shared,
)

FAMILY = CausalFamily(
    model_type="qwen2",
    backbone="QwenBackbone",
    converter="convert_qwen",
    run_layer=llama_layer,
    shared=llama_shared,
    run_cached=decoder_cached,
    lean_decoding=True,
    projections=DECODER_PROJECTIONS,
)
