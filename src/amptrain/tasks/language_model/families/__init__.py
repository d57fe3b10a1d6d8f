"""One adapter a causal language model's family (`model.pretrained` of the language-model
task; `base.CausalFamily`, the tokenizer `tokenizer.HubPieces` on the folder's
tokenizer.json); what its folder must hold is its entry in config/families.py.

| `model_type`  | keras-hub backbone  | converter        |
|---------------|---------------------|------------------|
| gpt2          | GPT2Backbone        | convert_gpt2     |
| llama         | Llama3Backbone      | convert_llama3   |
| qwen2         | QwenBackbone        | convert_qwen     |
| gemma         | GemmaBackbone       | convert_gemma    |
"""

from amptrain.tasks.language_model.families import gemma, gpt2, llama3, qwen2

CAUSAL = (gpt2, llama3, qwen2, gemma)
FAMILIES = {m.FAMILY.model_type: m.FAMILY for m in CAUSAL}


def family_of(checkpoint):
    """The adapter of a causal `config.pretrained.Checkpoint`."""
    return FAMILIES[checkpoint.model_type]
