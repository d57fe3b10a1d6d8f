"""A two-layer model whose backward pass can be poisoned: `poison` multiplies the
gradient flowing into the first layer, so `poison = inf` makes exactly that layer's
gradients non-finite while the loss stays finite (an fp16 overflow, made to order).

    model = poisoned_model()
    dataset = batches([[1.0, 1.0], [1.0, inf]])   # the second step overflows
"""

import keras
import numpy as np
import tensorflow as tf


@tf.custom_gradient
def _poisoned_identity(x, poison):
    def backward(upstream):
        return upstream * poison, tf.zeros_like(poison)

    return tf.identity(x), backward


class Poison(keras.layers.Layer):
    def call(self, x, poison):
        return _poisoned_identity(x, poison[:, None])


def poisoned_model():
    x = keras.Input(shape=(3,), name="x")
    poison = keras.Input(shape=(), name="poison")
    hidden = keras.layers.Dense(4, name="first", kernel_initializer="ones")(x)
    hidden = Poison(name="poison_layer")(hidden, poison)
    out = keras.layers.Dense(1, name="second", kernel_initializer="ones")(hidden)
    return keras.Model({"x": x, "poison": poison}, out)


def squared_error(targets, outputs):
    """The engine's loss contract: (sum over examples, number of examples)."""
    errors = tf.square(tf.squeeze(outputs, -1) - targets)
    return tf.reduce_sum(errors), tf.cast(tf.shape(targets)[0], tf.float32)


def batches(poisons, batch_size=2):
    """One batch a step; `poisons[i]` holds the poison of each example of step i."""
    poisons = np.asarray(poisons, np.float32).reshape(-1)
    n = len(poisons)
    x = np.tile(np.array([[0.1, -0.2, 0.3]], np.float32), (n, 1))
    features = {"x": x, "poison": poisons}
    targets = np.ones(n, np.float32)
    token_counts = np.ones((n, 2), np.int32)
    return tf.data.Dataset.from_tensor_slices((features, targets, token_counts)).batch(batch_size)
