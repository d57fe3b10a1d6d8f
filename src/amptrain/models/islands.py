"""float32 islands: the layers that compute (all or part) in float32 under a mixed policy,
each declaring why. `amptrain audit` shows the reason, and flags a layer that computes in
float32 under a mixed policy without one as a layer that ignored the policy.

    class MaskedMeanPooling(keras.layers.Layer):
        float32_reason = "a sum over up to max_length positions loses most of bf16's 8 bits"

    logits = float32_island(keras.layers.Dense(2, dtype="float32", name="logits"), "logits feed a softmax")
    island_reason(layer)  # the declared reason, or None

A declaration says what is intended; the audit checks what runs (the traced graph), so a
declared island whose softmax still runs in float16 is reported all the same.

A declaration on a Keras layer is kept in its config, so a saved model's islands are
islands again when it is loaded: `float32_island` makes the layer an instance of a
subclass of its class, of the same name, that only adds `float32_reason` to its config
(registered with Keras as "amptrain>float32_island.Dense" and so on). Nothing is rebuilt,
so the layer keeps its name, its variables and its place in the random sequence.
"""

import keras

from amptrain.models.dropout import Dropout

# Keras layers that upcast internally under mixed policies (checked on Keras 3.15: their
# traced graphs run the statistics / the softmax in float32).
KERAS_ISLANDS = (
    (keras.layers.LayerNormalization, "Keras computes the mean, variance and rsqrt in float32"),
    (keras.layers.BatchNormalization, "Keras computes the batch statistics in float32"),
    (keras.layers.MultiHeadAttention, "Keras computes the attention softmax in float32"),
)


def float32_island(layer, reason):
    """Declares `layer` a float32 island for `reason`; returns the layer."""
    if not getattr(type(layer), "is_float32_island", False):
        layer.__class__ = island_class(type(layer))
    layer.float32_reason = reason
    return layer


_ISLAND_CLASSES = {}


def island_class(base):
    """`base` (a Keras layer class) with `float32_reason` in its config, registered with
    Keras so that a saved model finds it when loaded."""
    if base not in _ISLAND_CLASSES:

        def __init__(self, *args, float32_reason=None, **kwargs):
            base.__init__(self, *args, **kwargs)
            self.float32_reason = float32_reason

        def get_config(self):
            return {**base.get_config(self), "float32_reason": self.float32_reason}

        namespace = {"__init__": __init__, "get_config": get_config, "__module__": __name__, "is_float32_island": True}
        cls = type(base.__name__, (base,), namespace)  # the audit shows the class's name: "Dense" stays "Dense"
        # amptrain's own layers may share a Keras layer's name (models.dropout.Dropout)
        owner = "amptrain." if base.__module__.startswith("amptrain.") else ""
        keras.saving.register_keras_serializable(package="amptrain", name=f"float32_island.{owner}{base.__name__}")(cls)
        _ISLAND_CLASSES[base] = cls
    return _ISLAND_CLASSES[base]


# Registered at import, for a model saved in another process: the classes amptrain's models
# declare islands of (a model with an island of another class loads where one was declared).
for _base in (keras.layers.Dense, keras.layers.Dropout, keras.layers.Activation, Dropout):
    island_class(_base)


def island_reason(layer):
    """Why `layer` computes (partly) in float32, or None when it does not mean to."""
    reason = getattr(layer, "float32_reason", None)
    if reason:
        return reason
    for cls, keras_reason in KERAS_ISLANDS:
        if isinstance(layer, cls):
            return keras_reason
    return None
