"""keras-hub's Hugging Face conversion, taking the weights as `transformers` saves them.

    encoder = load_backbone(family, "tests/pretrained/tiny-roberta", dtype="float32", dropout=0.0, name="enc")

keras-hub's converters name RoBERTa's, DistilBERT's and ALBERT's weights as a task model
saves them (`roberta.embeddings...`) and find a prefix only when the file has one more
than they ask for; `RobertaModel.save_pretrained` writes them without it. The loader here
also drops the converter's prefix when the file has none. The converter is keras-hub's
own (`keras_hub.src.utils.transformers.convert_<family>`), run on the built backbone.
"""

import importlib
import json
import os


def load_backbone(family, path, **kwargs):
    """The family's keras-hub backbone built from the folder's config.json (with the family's
    corrections: `CausalFamily.backbone_arguments`) and its weights converted into it."""
    import keras_hub

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    backbone = getattr(keras_hub.models, family.backbone)
    encoder = backbone.from_preset(path, load_weights=False, **kwargs, **family.backbone_arguments(config))
    converter = importlib.import_module(f"keras_hub.src.utils.transformers.{family.converter}")
    with _loader()(path) as loader:
        converter.convert_weights(encoder, loader, config)
    return encoder


def _loader():
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    class PrefixDroppingLoader(SafetensorLoader):
        def get_prefixed_key(self, hf_weight_key, dict_like):
            key = super().get_prefixed_key(hf_weight_key, dict_like)
            head, _, rest = hf_weight_key.partition(".")
            if key not in dict_like.keys() and rest and head in ("roberta", "distilbert", "albert", "bert"):
                return super().get_prefixed_key(rest, dict_like)
            return key

    return PrefixDroppingLoader
