"""Layers whose backward pass keeps only what it needs: the same forward arithmetic as
Keras's, fewer and smaller tensors held between the forward and the backward pass.

What a training step keeps for its backward pass is most of its memory a row of the batch
(`engine/memory.py` counts it). Three of Keras's pieces keep more than their gradients need,
and under a mixed policy they keep it in float32, so half precision did not halve them:

- the exact GELU's gradient kept three tensors of the feed-forward width (the erfc, and two
  products) besides its input; here it keeps the input only and recomputes the rest;
- layer normalisation upcasts its input to float32 and kept that copy and the normalised
  float32 product (two float32 tensors of the hidden width a norm); here it keeps the input
  in the compute dtype and the float32 mean and reciprocal deviation (one number a position),
  and recomputes the normalised input in float32 in the backward pass;
- the attention's float32 softmax kept its float32 probabilities; `masked_softmax` keeps them
  in the compute dtype they are cast to anyway (bfloat16 holds probabilities to 3 significant
  digits, as the product with the values already uses them). Under float32 it is Keras's.

Each gradient equals autodiff's to rounding (tests/models/test_lean.py): the GELU's in its input's
dtype, as autodiff's; the norm's and the softmax's in float32.

The GELU's forward and backward bodies and the softmax's backward body are `xla_modes.kernel`s:
in a training step (with `runtime.fused_kernels`, the default) one XLA computation each, a
single loop over the tensor where TensorFlow ran a kernel per op (the GELU's backward alone
was ten, and Eigen's bfloat16 erfc runs an element at a time); elsewhere the same ops. XLA
rounds a bfloat16 chain once at its end, TensorFlow after every op
(tests/models/test_kernels.py). The norm's chains, the softmax's forward one and dropout's
were slower as XLA computations; the softmax's backward, at 256 positions, took a layer's
softmax from 29 to 21 ms (docs/benchmarks.md).
"""

import keras
import tensorflow as tf

from amptrain.xla_modes import kernel

_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def after(gradient):
    """Ops made under it wait for `gradient`: a backward pass's recomputation that reads only
    forward tensors would otherwise be ready, and run, during the forward pass, and its result
    (a float32 copy, say) would be held until the gradient came, which is what it is here not
    to hold. (XLA ignores control edges and schedules for memory itself.)"""
    return tf.control_dependencies([gradient])


@kernel
def _gelu(x):
    return 0.5 * x * tf.math.erfc(-x * tf.cast(_SQRT_HALF, x.dtype))


@kernel
def _gelu_gradient(x, dy):
    # In x's dtype, as autodiff computed it: float32 temporaries of the feed-forward
    # width were the largest part of the backward pass's peak under a mixed policy.
    half, scale = tf.cast(0.5, x.dtype), tf.cast(_INV_SQRT_2PI, x.dtype)
    cdf = half * tf.math.erfc(-x * tf.cast(_SQRT_HALF, x.dtype))
    return dy * (cdf + x * (tf.exp(-half * x * x) * scale))


@keras.saving.register_keras_serializable(package="amptrain")
def gelu(x):
    """The exact GELU, x * Φ(x), as `keras.activations.gelu(approximate=False)` computes it,
    keeping only `x` for the backward pass."""

    @tf.custom_gradient
    def forward(x):
        def backward(dy):
            with after(dy):
                return _gelu_gradient(x, dy)

        return _gelu(x), backward

    return forward(x)


@kernel
def _softmax_gradient(probabilities, dprobabilities, keep, dtype):
    # In float32 from the kept probabilities, returned in the scores' dtype: one loop where
    # TensorFlow ran two casts, a product, a sum, a difference, a product, the mask's select
    # and the cast back, each over the (batch, heads, query, key) tensor.
    p = tf.cast(probabilities, tf.float32)
    g = tf.cast(dprobabilities, tf.float32)
    gradient = p * (g - tf.reduce_sum(g * p, axis=-1, keepdims=True))
    if keep is not None:  # a masked score gets none (a row masked whole has p = 1/n there)
        gradient = tf.where(keep, gradient, tf.zeros((), tf.float32))
    return tf.cast(gradient, dtype)


def masked_softmax(scores, keep, dtype):
    """softmax over the last axis of `scores` (any float dtype) in float32, the keys `keep`
    says left out (bool, broadcastable; None: none), cast to `dtype`. Under a mixed policy it
    keeps only the cast probabilities for the backward pass, whose arithmetic is one kernel."""

    def probabilities_of(scores):
        x = tf.cast(scores, tf.float32)
        if keep is not None:
            # A scalar, broadcast by the select: a tensor of the scores' size filled with it
            # depends on nothing, so it would be made at the step's start and held.
            x = tf.where(keep, x, tf.constant(-1e9, tf.float32))
        return tf.nn.softmax(x, axis=-1)

    if tf.as_dtype(dtype) == tf.float32:
        return probabilities_of(scores)
    scores_dtype = scores.dtype

    @tf.custom_gradient
    def forward(scores):
        probabilities = tf.cast(probabilities_of(scores), dtype)

        def backward(dprobabilities):
            return _softmax_gradient(probabilities, dprobabilities, keep, scores_dtype)

        return probabilities, backward

    return forward(scores)


def _layer_norm(x, gamma, beta, epsilon):
    """(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis, in float32, returned
    in x's dtype; keeps x, and the float32 mean and reciprocal deviation."""

    @tf.custom_gradient
    def forward(x, gamma, beta):
        x32 = tf.cast(x, tf.float32)
        mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
        inverse = tf.math.rsqrt(variance + epsilon)
        y = tf.cast((x32 - mean) * inverse * gamma + beta, x.dtype)

        def backward(dy):
            with after(dy):
                normed = (tf.cast(x, tf.float32) - mean) * inverse
            dy32 = tf.cast(dy, tf.float32)
            outer = tf.range(tf.rank(dy32) - 1)
            dgamma = tf.reduce_sum(dy32 * normed, axis=outer)
            dbeta = tf.reduce_sum(dy32, axis=outer)
            dnormed = dy32 * gamma
            dx = inverse * (
                dnormed
                - tf.reduce_mean(dnormed, axis=-1, keepdims=True)
                - normed * tf.reduce_mean(dnormed * normed, axis=-1, keepdims=True)
            )
            return tf.cast(dx, x.dtype), dgamma, dbeta

        return y, backward

    return forward(x, gamma, beta)


@keras.saving.register_keras_serializable(package="amptrain")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (same arguments, variables and config) whose backward
    pass keeps its input in the compute dtype instead of two float32 copies. Over the last axis
    with a scale and a centre, as every block here uses it; otherwise Keras's own."""

    def call(self, inputs):
        if self.axis not in (-1, [-1], len(inputs.shape) - 1, [len(inputs.shape) - 1]):
            return super().call(inputs)
        if not (self.scale and self.center) or getattr(self, "rms_scaling", False):
            return super().call(inputs)
        gamma = tf.cast(self.gamma, tf.float32)
        beta = tf.cast(self.beta, tf.float32)
        return _layer_norm(tf.cast(inputs, self.compute_dtype), gamma, beta, self.epsilon)
