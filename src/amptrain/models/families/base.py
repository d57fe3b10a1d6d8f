"""What one pretrained encoder family is to amptrain (`Family`), and the pieces the families
share (a causal language model's: `tasks/language_model/families/`).

    family = FAMILIES["roberta"]
    family.backbone, family.pad_id                           # "RobertaBackbone", 1
    tokenizer = family.tokenizer(checkpoint)                 # amptrain ids, WordPiece's surface
    layers = family.layers(encoder)                          # bottom to top (the layer-wise decay)

Every family here places its pieces as BERT does: the start piece, the pieces, the end
piece, a cut text keeping its end piece (`tasks.classification.cut`, and the serving
graphs): a family states its start and end through its tokenizer (`start_id`, `end_id`).
What a family's folder must hold (config keys, tokenizer files, casing, the weights' names)
is its entry in config/families.py, checked before anything is built.
"""

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str  # config.json's `model_type`
    backbone: str  # the keras-hub backbone class (keras_hub.models.<backbone>)
    converter: str  # its Hugging Face converter (keras_hub.src.utils.transformers.<converter>)
    make_tokenizer: Callable  # (folder, lowercase) -> the tokenizer (amptrain ids)
    layers: Callable  # (encoder) -> its transformer layers, bottom to top
    keras_hub_activation: str = "gelu"  # what keras-hub builds; the checkpoint's replaces it
    pad_id: int = 0  # the padding piece's id in the checkpoint
    segment_ids: bool = False  # the backbone takes segment ids (all 0: single texts)
    pooler: str = ""  # the backbone's [CLS] pooler layer, or none ("cls" pooling: the first state)
    correct: Callable = lambda encoder, checkpoint: None  # corrections beyond the shared ones
    backbone_arguments: Callable = lambda config: {}  # (config.json's dict) -> keras-hub's arguments

    def tokenizer(self, checkpoint):
        return self.make_tokenizer(checkpoint.path, checkpoint.lowercase)


def bert_layers(encoder):
    return [encoder.get_layer(f"transformer_layer_{i}") for i in range(encoder.num_layers)]
