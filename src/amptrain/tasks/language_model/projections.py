"""The call of a LoRA run's frozen float projections: x K + (alpha / rank) (x A) B, the
adapters never merged into the kernel, and the kernel's compute-dtype copy not kept for the
backward pass (read from its variable again there): what Keras' own int8 and int4 layers
compute, and PEFT.

    lean_projections(model.blocks, family.projections)   # after the adapters are on (lora.py)

Keras' float Dense and EinsumDense with LoRA multiply by the merged kernel K + (alpha/rank) A B:
each step makes that kernel and its cast, keeps the cast for the backward pass, and computes
the merged kernel's whole gradient (a product as costly as the forward one) to reach A and B.
A frozen projection without adapters kept its kernel's cast from the forward pass to the
backward one too. Here the input's gradient is dy K^T from a fresh cast, and A and B get
theirs through the two small products alone. A quantized projection keeps Keras' call
(already so); a layer of another class, or an equation whose input gradient is not one
einsum, is left as it is.
"""

import keras
import tensorflow as tf
from keras import ops


class _Lean:
    """The call of a frozen projection (a Dense or an EinsumDense, `_product` and `_backward`)."""

    def call(self, inputs, training=None):
        x = _frozen_product(self, inputs)
        if self.lora_enabled:
            adapted = ops.matmul(self._product(inputs, self.lora_kernel_a), self.lora_kernel_b)
            x = ops.cast(ops.add(x, (self.lora_alpha / self.lora_rank) * adapted), self.compute_dtype)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x


class LeanDense(_Lean, keras.layers.Dense):
    def _product(self, inputs, kernel):
        return ops.matmul(inputs, kernel)

    def _backward(self, upstream, kernel):
        return ops.matmul(upstream, ops.transpose(kernel))


class LeanEinsumDense(_Lean, keras.layers.EinsumDense):
    def _product(self, inputs, kernel):
        return ops.einsum(self.equation, inputs, kernel)

    def _backward(self, upstream, kernel):
        return ops.einsum(input_gradient_equation(self.equation), upstream, kernel)


def _frozen_product(layer, inputs):
    # The kernel in the compute dtype (Keras' autocast) for the forward product only. A read
    # nothing waits for runs when the step starts (TensorFlow's executor runs what is ready):
    # the forward's casts are all made then and freed as the forward pass uses them, before
    # the backward pass, whose own casts wait for its gradients (below); waiting for the input
    # here too saved no peak and made the forward pass wait. A tensor, not the variable: a
    # variable read inside a custom gradient's function asks it for a gradient.
    kernel = tf.convert_to_tensor(layer._kernel.value)
    dtype = layer.compute_dtype

    @ops.custom_gradient
    def product(x):
        def gradient(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            with tf.control_dependencies([upstream]):  # read again when the backward pass is here
                again = ops.cast(layer._kernel, dtype)
            return layer._backward(upstream, again)

        return layer._product(x, kernel), gradient

    return product(inputs)


def input_gradient_equation(equation):
    """The einsum "Y,K->X" for "X,K->Y" (the input's gradient from the output's), or None
    where that is not the input's gradient: an ellipsis, or an input axis summed alone."""
    if "..." in equation:
        return None
    inputs, rest = equation.replace(" ", "").split(",")
    kernel, output = rest.split("->")
    if any(axis not in kernel + output for axis in inputs):
        return None
    return f"{output},{kernel}->{inputs}"


LEAN = {keras.layers.Dense: LeanDense, keras.layers.EinsumDense: LeanEinsumDense}


def lean_projections(layers):
    """Each of `layers` whose kernel is frozen and float, of Keras' own Dense or EinsumDense,
    given the lean call (its class swapped for the subclass; its weights untouched). Returns
    how many were."""
    swapped = 0
    for layer in layers:
        lean = LEAN.get(type(layer))
        if lean is None or getattr(layer, "quantization_mode", None) is not None or layer._kernel.trainable:
            continue
        if lean is LeanEinsumDense and input_gradient_equation(layer.equation) is None:
            continue
        layer.__class__ = lean
        swapped += 1
    return swapped


def keras_projections(layers):
    """The lean projections among `layers` given Keras' own class back (an export's model)."""
    for layer in layers:
        for keras_class, lean in LEAN.items():
            if type(layer) is lean:
                layer.__class__ = keras_class
