"""What one pretrained family is to amptrain (`Family`), and the pieces the families share.

    family = FAMILIES["roberta"]
    family.backbone, family.config_keys["hidden_dim"]       # "RobertaBackbone", "hidden_size"
    tokenizer = family.tokenizer(checkpoint)                 # amptrain ids, WordPiece's surface
    layers = family.layers(encoder)                          # bottom to top (the layer-wise decay)

Every family here places its pieces as BERT does: the start piece, the pieces, the end
piece, a cut text keeping its end piece (`tasks.classification.cut`, and the serving
graphs): a family states its start and end through its tokenizer (`start_id`, `end_id`).
Nothing here imports TensorFlow: `config/pretrained.py` reads a folder with it.
"""

import dataclasses
from collections.abc import Callable

# The model.* keys a checkpoint fixes (config/pretrained.py); a family maps them to its
# config.json names, with these two.
SHAPE_KEYS = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim")
SIZE_KEYS = ("vocabulary_size", "max_positions")


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str  # config.json's `model_type`
    backbone: str  # the keras-hub backbone class (keras_hub.models.<backbone>)
    converter: str  # its Hugging Face converter (keras_hub.src.utils.transformers.<converter>)
    config_keys: dict  # amptrain's SHAPE_KEYS and SIZE_KEYS -> the config.json names
    tokenizer_files: tuple  # what the folder must hold besides config.json and the weights
    make_tokenizer: Callable  # (folder, lowercase) -> the tokenizer (amptrain ids)
    lowercase: Callable  # (tokenizer_config.json's dict) -> whether it lower-cases
    layers: Callable  # (encoder) -> its transformer layers, bottom to top
    weight_shapes: Callable  # (config.json's dict) -> {weight name: shape} the weights must hold
    activation_key: str = "hidden_act"
    keras_hub_activation: str = "gelu"  # what keras-hub builds; the checkpoint's replaces it
    position_offset: int = 0  # positions the family reserves (RoBERTa: 2)
    pad_id: int = 0  # the padding piece's id in the checkpoint
    segment_ids: bool = False  # the backbone takes segment ids (all 0: single texts)
    pooler: str = ""  # the backbone's [CLS] pooler layer, or none ("cls" pooling: the first state)
    correct: Callable = lambda encoder, checkpoint: None  # corrections beyond the shared ones

    def tokenizer(self, checkpoint):
        return self.make_tokenizer(checkpoint.path, checkpoint.lowercase)


def bert_layers(encoder):
    return [encoder.get_layer(f"transformer_layer_{i}") for i in range(encoder.num_layers)]


def lower_cased(tokenizer_config):
    """`do_lower_case` (absent: lower-cased, as `transformers`' BERT tokenizers default)."""
    return bool(tokenizer_config.get("do_lower_case", True))


def cased(tokenizer_config):
    return False


def encoder_weights(prefix, config, layer_key="num_hidden_layers", extra=()):
    """{name: shape} of the weights every layer of a BERT-like checkpoint holds: the word
    embeddings, and each layer's first and last weights (`extra` adds more)."""
    shapes = dict(extra)
    for i in range(config[layer_key]):
        shapes.update(bert_layer_weights(f"{prefix}encoder.layer.{i}.", config))
    return shapes


def bert_layer_weights(prefix, config):
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    return {
        f"{prefix}attention.self.query.weight": (hidden, hidden),
        f"{prefix}output.dense.weight": (hidden, intermediate),
    }
