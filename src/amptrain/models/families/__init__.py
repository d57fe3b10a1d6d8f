"""One adapter a pretrained family (`model.pretrained`), as keras-hub keeps a folder a model:
the backbone, the tokenizer and its special pieces, the config keys, the layer walk and the
pooling (`base.Family`). Adding a family is one file here, its line below, and its tests.

| `model_type`  | keras-hub backbone  | tokenizer files           |
|---------------|---------------------|---------------------------|
| bert          | BertBackbone        | vocab.txt                 |
| roberta       | RobertaBackbone     | vocab.json, merges.txt    |
| xlm-roberta   | XLMRobertaBackbone  | sentencepiece.bpe.model   |
| distilbert    | DistilBertBackbone  | vocab.txt                 |
| albert        | AlbertBackbone      | spiece.model              |
"""

from amptrain.models.families import albert, bert, distilbert, roberta, xlm_roberta

FAMILIES = {m.FAMILY.model_type: m.FAMILY for m in (bert, roberta, xlm_roberta, distilbert, albert)}
