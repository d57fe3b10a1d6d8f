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

A causal language model's family (GPT-2, Llama 3, Qwen2, Gemma) is the language-model task's
own: `tasks/language_model/families/`. `loading.py` (keras-hub's conversion) and
`tokenizers.py` (byte-level BPE) serve both.
"""

from amptrain.models.families import albert, bert, distilbert, roberta, xlm_roberta

ENCODERS = (bert, roberta, xlm_roberta, distilbert, albert)
FAMILIES = {m.FAMILY.model_type: m.FAMILY for m in ENCODERS}


def family_of(checkpoint):
    """The adapter of an encoder's `config.pretrained.Checkpoint`."""
    return FAMILIES[checkpoint.model_type]
