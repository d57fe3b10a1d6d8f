"""Pretrained encoders (`model.pretrained`): keras-hub's backbone of the checkpoint's family
(models/families/: BERT, RoBERTa, XLM-R, DistilBERT, ALBERT), loaded offline from the
checkpoint's folder, on amptrain's inputs; the tasks put their heads on it
(`tasks/classification/pretrained.py`, `tasks/ner/pretrained.py`).

    outputs = encode_pretrained(checkpoint, token_ids, padding_mask, config.model, "mixed_bfloat16")
    outputs["sequence_output"]                            # (batch, length, hidden)
    scales = learning_rate_scales(model, config.train)   # {id(variable): factor}, or None

The encoder is keras-hub's own (`<Family>Backbone.from_preset` reads a Hugging Face folder
through its converter, or a keras-hub BERT preset), built under the run's policy, with
these corrections (`load_encoder`): the checkpoint's GELU where keras-hub builds the other
form, the family's own (`Family.correct`: RoBERTa's token-type embedding), and
each attention softmax computed in float32 (keras-hub's attention ran it in float16 under
`mixed_float16`; `amptrain audit` found it). Its layer norms upcast by themselves.
"""

import keras
from keras import ops

from amptrain.models.blocks import SOFTMAX_REASON
from amptrain.models.families import family_of
from amptrain.models.families.layers import FirstState, SwapIds
from amptrain.models.families.loading import load_backbone

ENCODER_NAME = "pretrained_encoder"
# Variables whose names hold these take no weight decay (biases, layer norms' scale and offset).
NO_DECAY = ("bias", "gamma", "beta")


def load_encoder(checkpoint, dtype, dropout):
    """keras-hub's backbone of the checkpoint's family with its weights, computing under
    `dtype`, corrected against `transformers` (the module docstring; models/families/)."""
    import keras_hub

    family = family_of(checkpoint)
    options = {"dtype": dtype, "dropout": dropout, "name": ENCODER_NAME}
    if checkpoint.layout == "huggingface":
        encoder = load_backbone(family, checkpoint.path, **options)
    else:
        encoder = keras_hub.models.BertBackbone.from_preset(checkpoint.path, **options)
    layers = family.layers(encoder)
    for layer in layers:
        # Keras' MultiHeadAttention builds its softmax under the layer's policy: float16
        # under mixed_float16 (`amptrain audit` finds it). This one computes in float32.
        # The built layer takes no new sub-layer: its softmax becomes a Float32Softmax in place.
        layer._self_attention_layer._softmax.__class__ = Float32Softmax
    if checkpoint.activation != family.keras_hub_activation:
        # keras-hub builds BERT's and ALBERT's feed-forward with the tanh GELU, the others'
        # with the exact one; a checkpoint trained with the other form gets it back (hidden
        # states then match `transformers` within 1e-4, not 1e-3). The layer's own
        # `activation` too, so its config says the same.
        activation = keras.activations.get("gelu") if checkpoint.activation == "gelu" else gelu_approximate
        for layer in layers:
            layer.activation = activation
            layer._feedforward_intermediate_dense.activation = activation
    if checkpoint.layout == "huggingface":
        family.correct(encoder, checkpoint)
    return encoder


def gelu_approximate(x):
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="amptrain")
class Float32Softmax(keras.layers.Softmax):
    """Keras' Softmax (its mask included), computed in float32 and returned in the input's dtype."""

    float32_reason = SOFTMAX_REASON

    def call(self, inputs, mask=None):
        return ops.cast(super().call(ops.cast(inputs, "float32"), mask=mask), inputs.dtype)


@keras.saving.register_keras_serializable(package="amptrain")
class SegmentIds(keras.layers.Layer):
    """Segment 0 for every piece: amptrain's inputs are single texts."""

    def call(self, token_ids):
        return ops.zeros_like(token_ids)


def encode_pretrained(checkpoint, token_ids, padding_mask, model_config, dtype, pooled=False):
    """(the states, (batch, length, hidden), and the pooled state) of the encoder on amptrain's inputs."""
    family = family_of(checkpoint)
    encoder = load_encoder(checkpoint, dtype, model_config.dropout)
    if family.pooler:
        # The [CLS] pooler gets no gradient unless its output is used: frozen, it is no variable to update.
        encoder.get_layer(family.pooler).trainable = pooled
    inputs = {"token_ids": token_ids, "padding_mask": ops.cast(padding_mask, "int32")}
    if family.pad_id:
        inputs["token_ids"] = SwapIds(family.pad_id, dtype=dtype, name="checkpoint_ids")(token_ids)
    if family.segment_ids:
        inputs["segment_ids"] = SegmentIds(dtype=dtype, name="segment_ids")(token_ids)
    outputs = encoder(inputs)
    if not isinstance(outputs, dict):  # RoBERTa, XLM-R, DistilBERT: the states alone, no pooler
        outputs = {"sequence_output": outputs}
    if "pooled_output" not in outputs and pooled:
        outputs["pooled_output"] = FirstState(dtype=dtype, name="first_state")(outputs["sequence_output"])
    return outputs


def find_encoder(model):
    """The model's pretrained encoder layer, or None."""
    for layer in model.layers:
        if layer.name == ENCODER_NAME:
            return layer
    return None


def learning_rate_scales(model, train_config):
    """{id(variable): factor of train.learning_rate} for a model on a pretrained encoder
    (None for any other): the top encoder layer 1, each layer below it `train.layer_decay`
    times the one above, the embeddings one step below the bottom layer; the head
    `train.head_learning_rate / train.learning_rate` (1 when 0)."""
    encoder = find_encoder(model)
    if encoder is None:
        return None
    t = train_config
    head = t.head_learning_rate / t.learning_rate if t.head_learning_rate else 1.0
    scales = {id(v): head for v in model.trainable_variables}
    family = _family_of(encoder)
    layers = family.layers(encoder)  # bottom to top; ALBERT's shared ones once each
    for v in encoder.trainable_variables:
        scales[id(v)] = t.layer_decay ** len(layers)  # the embeddings (and their norm)
    for i, layer in enumerate(layers):
        for v in layer.trainable_variables:
            scales[id(v)] = t.layer_decay ** (len(layers) - 1 - i)
    if family.pooler:
        for v in encoder.get_layer(family.pooler).trainable_variables:
            scales[id(v)] = 1.0  # the [CLS] pooler sits on the top layer
    return scales


def _family_of(encoder):
    """The family adapter of a keras-hub backbone (by its class)."""
    from amptrain.models.families import FAMILIES

    (family,) = [f for f in FAMILIES.values() if f.backbone == type(encoder).__name__]
    return family


def decays(variable):
    """Whether weight decay applies to `variable` (not to biases and layer norms)."""
    name = variable.path.split("/")[-1]
    return not any(part in name for part in NO_DECAY)
