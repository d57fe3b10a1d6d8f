"""What one causal language model's family is to the language-model task (`CausalFamily`),
and the pieces the families share: how keras-hub's decoder layers run on amptrain's masks
and caches, and where LoRA's target projections are in them."""

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class CausalFamily:
    """A decoder-only language model's family (the language-model task's `model.pretrained`):
    keras-hub's backbone and converter, the corrections its converter needs against
    `transformers` (`backbone_arguments`: the backbone's keyword arguments from config.json),
    and how its decoder layers run on amptrain's masks and caches (`tasks/language_model/pretrained.py`).
    The tokenizer is the folder's `tokenizer.json` (`families/tokenizer.py`), for every family."""

    model_type: str  # config.json's `model_type`
    backbone: str  # the keras-hub backbone class (keras_hub.models.<backbone>)
    converter: str  # its Hugging Face converter (keras_hub.src.utils.transformers.<converter>)
    # (config.json's dict) -> keyword arguments that correct what the converter reads
    backbone_arguments: Callable = lambda config: {}
    embedding_scale: bool = False  # Gemma: the token embedding times sqrt(hidden)
    # (decoder layer, x, keep, training, **shared) -> x: `keep` bool (batch, query, key), causal and same-document
    run_layer: Callable = None
    # (first decoder layer, x) -> keyword arguments of every run_layer call of one forward pass
    # (what all layers read alike, made once: Llama's and Qwen2's RoPE rotation); None: none
    shared: Callable = None
    # (decoder layer, x, cache, index) -> (x, cache): one position over the layer's cache
    run_cached: Callable = None
    # Llama's and Qwen2's layers: generation runs `decoding.decoder_step` instead of run_cached
    lean_decoding: bool = False
    # LoRA's target names (`train.lora_targets`) -> the sub-layer of a decoder layer, by attribute path
    projections: dict = dataclasses.field(default_factory=dict)

    def tokenizer(self, checkpoint):
        from amptrain.tasks.language_model.families.tokenizer import HubPieces

        return HubPieces.from_checkpoint(checkpoint)


def llama_layer(layer, x, keep, training, rotation=None):
    """Llama's and Qwen2's decoder layers on `keep`, lean (`families/lean_layer.py`): keras-hub's
    arithmetic, less held for the backward pass."""
    from amptrain.tasks.language_model.families.lean_layer import decoder_layer

    return decoder_layer(layer, x, keep, training, rotation)


def llama_shared(layer, x):
    """RoPE's rotation of x's positions, which every Llama or Qwen2 layer applies alike."""
    from amptrain.tasks.language_model.families.lean_layer import rotation_of

    return {"rotation": rotation_of(layer, x)}


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
