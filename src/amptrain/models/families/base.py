"""What one pretrained family is to amptrain (`Family`), and the pieces the families share.

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


@dataclasses.dataclass(frozen=True)
class CausalFamily:
    """A decoder-only language model's family (the language-model task's `model.pretrained`):
    keras-hub's backbone and converter, the corrections its converter needs against
    `transformers` (`backbone_arguments`: the backbone's keyword arguments from config.json),
    and how its decoder layers run on amptrain's masks and caches (`tasks/language_model/pretrained.py`).
    The tokenizer is the folder's `tokenizer.json` (`families.causal_tokenizer`), for every family."""

    model_type: str  # config.json's `model_type`
    backbone: str  # the keras-hub backbone class (keras_hub.models.<backbone>)
    converter: str  # its Hugging Face converter (keras_hub.src.utils.transformers.<converter>)
    # (config.json's dict) -> keyword arguments that correct what the converter reads
    backbone_arguments: Callable = lambda config: {}
    embedding_scale: bool = False  # Gemma: the token embedding times sqrt(hidden)
    # (decoder layer, x, keep, training) -> x: `keep` bool (batch, query, key), causal and same-document
    run_layer: Callable = None
    # (decoder layer, x, cache, index) -> (x, cache): one position over the layer's cache
    run_cached: Callable = None
    # LoRA's target names (`train.lora_targets`) -> the sub-layer of a decoder layer, by attribute path
    projections: dict = dataclasses.field(default_factory=dict)

    def tokenizer(self, checkpoint):
        from amptrain.models.families.causal_tokenizer import HubPieces

        return HubPieces.from_checkpoint(checkpoint)


def llama_layer(layer, x, keep, training):
    """Llama's and Qwen2's decoder layers: `keep` is their attention mask (they add the causal part)."""
    return layer(x, decoder_attention_mask=keep, training=training)


def decoder_cached(layer, x, cache, index):
    """One position of a keras-hub decoder layer over its cache (GPT-2's, Llama's, Qwen2's)."""
    return layer(x, self_attention_cache=cache, self_attention_cache_update_index=index)


DECODER_PROJECTIONS = {
    "query": "_self_attention_layer._query_dense",
    "key": "_self_attention_layer._key_dense",
    "value": "_self_attention_layer._value_dense",
    "output": "_self_attention_layer._output_dense",
    "gate": "_feedforward_gate_dense",
    "up": "_feedforward_intermediate_dense",
    "down": "_feedforward_output_dense",
}
