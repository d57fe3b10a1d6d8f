"""One adapter a pretrained family (`model.pretrained`), as keras-hub keeps a folder a model:
the backbone, the tokenizer and its special pieces, the layer walk, the pooling and the
corrections (`base.Family`); what its folder must hold is its entry in config/families.py.
Adding a family is one file here, its line below and there, and its tests.

| `model_type`  | keras-hub backbone  | tokenizer files           |
|---------------|---------------------|---------------------------|
| bert          | BertBackbone        | vocab.txt                 |
| roberta       | RobertaBackbone     | vocab.json, merges.txt    |
| xlm-roberta   | XLMRobertaBackbone  | sentencepiece.bpe.model   |
| distilbert    | DistilBertBackbone  | vocab.txt                 |
| albert        | AlbertBackbone      | spiece.model              |

Causal language models (the language-model task; `base.CausalFamily`, the tokenizer
`causal_tokenizer.HubPieces` on the folder's tokenizer.json):

| `model_type`  | keras-hub backbone  | converter        |
|---------------|---------------------|------------------|
| gpt2          | GPT2Backbone        | convert_gpt2     |
| llama         | Llama3Backbone      | convert_llama3   |
| qwen2         | QwenBackbone        | convert_qwen     |
| gemma         | GemmaBackbone       | convert_gemma    |
"""

from amptrain.models.families import albert, bert, distilbert, gemma, gpt2, llama3, qwen2, roberta, xlm_roberta

ENCODERS = (bert, roberta, xlm_roberta, distilbert, albert)
CAUSAL = (gpt2, llama3, qwen2, gemma)
FAMILIES = {m.FAMILY.model_type: m.FAMILY for m in ENCODERS + CAUSAL}


def family_of(checkpoint):
    """The adapter of a `config.pretrained.Checkpoint`."""
    return FAMILIES[checkpoint.model_type]
