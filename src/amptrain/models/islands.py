"""float32 islands: the layers that compute (all or part) in float32 under a mixed policy,
each declaring why. `amptrain audit` shows the reason, and flags a layer that computes in
float32 under a mixed policy without one as a layer that ignored the policy.

    class MaskedMeanPooling(keras.layers.Layer):
        float32_reason = "a sum over up to max_length positions loses most of bf16's 8 bits"

    logits = float32_island(keras.layers.Dense(2, dtype="float32", name="logits"), "logits feed a softmax")
    island_reason(layer)  # the declared reason, or None

A declaration says what is intended; the audit checks what runs (the traced graph), so a
declared island whose softmax still runs in float16 is reported all the same.
"""

import keras

# Keras layers that upcast internally under mixed policies (checked on Keras 3.15: their
# traced graphs run the statistics / the softmax in float32).
KERAS_ISLANDS = (
    (keras.layers.LayerNormalization, "Keras computes the mean, variance and rsqrt in float32"),
    (keras.layers.BatchNormalization, "Keras computes the batch statistics in float32"),
    (keras.layers.MultiHeadAttention, "Keras computes the attention softmax in float32"),
)


def float32_island(layer, reason):
    """Declares `layer` a float32 island for `reason`; returns the layer."""
    layer.float32_reason = reason
    return layer


def island_reason(layer):
    """Why `layer` computes (partly) in float32, or None when it does not mean to."""
    reason = getattr(layer, "float32_reason", None)
    if reason:
        return reason
    for cls, keras_reason in KERAS_ISLANDS:
        if isinstance(layer, cls):
            return keras_reason
    return None
