"""Pooling a sequence's states into one vector, shared by the classifier, its head on a
pretrained encoder and users' models (examples/parallel_sentences).

    pooled = MaskedMeanPooling(dtype="float32")(states, padding_mask)   # (batch, hidden)
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="amptrain")
class MaskedMeanPooling(keras.layers.Layer):
    """Mean of the states of real (unmasked) tokens."""

    float32_reason = "a sum over up to max_length positions loses most of bf16's 8 bits"

    def call(self, states, padding_mask):
        # float32: a sum over up to max_length positions loses most of bf16's 8 bits.
        states = ops.cast(states, "float32")
        mask = ops.cast(padding_mask, "float32")[:, :, None]  # (batch, length, 1)
        total = ops.sum(states * mask, axis=1)
        count = ops.maximum(ops.sum(mask, axis=1), 1.0)  # padding rows have no tokens
        return total / count  # (batch, hidden)
