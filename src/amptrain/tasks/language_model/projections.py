"""The call of a LoRA run's frozen projections (float or int8): x K + (alpha / rank) (x A) B,
the adapters never merged into the kernel, and the kernel's compute-dtype copy not kept for
the backward pass (made from its variable again there), as PEFT computes.

    lean_projections(layers)    # after the adapters are on (lora.py)
    keras_projections(layers)   # Keras' own classes back (the export's merge)

Keras' float Dense and EinsumDense with LoRA multiply by the merged kernel K + (alpha/rank) A B:
each step makes that kernel and its cast, keeps the cast for the backward pass, and computes
the merged kernel's whole gradient (a product as costly as the forward one) to reach A and B.
A frozen projection without adapters kept its kernel's cast from the forward pass to the
backward one too. Here the input's gradient is dy K^T from a fresh cast, and A and B get
theirs through the two small products alone. Keras' int8 call leaves the adapters unmerged,
but dequantizes the kernel for the backward pass from the forward pass's reads, which
TensorFlow may run as soon as it can; here it is dequantized once the backward pass reaches
the layer. Keras' int4 call (in blocks of inputs) has the same race and dequantizes through a
gather of each row's block scale and zero point: three float32 tensors of the kernel's size
a kernel, all of them at the step's start when the executor runs them at once; here a kernel
is one XLA loop from the packed codes to the compute dtype in any graph (`_int4_kernel`), for
the backward pass once it reaches the layer. A layer of another class or quantization, or an
equation whose input gradient is not one einsum, is left as it is.
"""

import contextlib

import keras
import tensorflow as tf
from keras import ops


class _Lean:
    """The call of a frozen projection (a Dense or an EinsumDense, `_product` and `_backward`),
    its kernel float or quantized (Keras sends a quantized layer's call to `quantized_call`)."""

    def quantized_call(self, inputs, training=None):
        return self.call(inputs, training=training)

    def call(self, inputs, training=None):
        x = _frozen_product(self, inputs, training)
        if self.lora_enabled:
            adapted = last_axis_product(self._product(inputs, self.lora_kernel_a), self.lora_kernel_b)
            x = ops.cast(ops.add(x, (self.lora_alpha / self.lora_rank) * adapted), self.compute_dtype)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x


class LeanDense(_Lean, keras.layers.Dense):
    def _product(self, inputs, kernel):
        return last_axis_product(inputs, kernel)

    def _backward(self, upstream, kernel):
        return last_axis_product(upstream, kernel, transpose=True)


class LeanEinsumDense(_Lean, keras.layers.EinsumDense):
    def _product(self, inputs, kernel):
        return tf.einsum(self.equation, inputs, tf.convert_to_tensor(kernel))

    def _backward(self, upstream, kernel):
        return tf.einsum(input_gradient_equation(self.equation), upstream, kernel)


def last_axis_product(x, kernel, transpose=False):
    """x (..., inputs) times `kernel` (inputs, outputs), or its transpose: one matrix product of
    the rows, which Keras' `ops.matmul` makes a `tensordot` of twenty-odd shape ops (a graph
    of SmolLM2's 30 layers carried thousands, each instantiated and run every step)."""
    kernel = tf.convert_to_tensor(kernel)
    outputs = kernel.shape[0 if transpose else 1]
    rows = tf.reshape(x, (-1, x.shape[-1] if x.shape[-1] is not None else tf.shape(x)[-1]))
    y = tf.matmul(rows, kernel, transpose_b=transpose)
    leading = x.shape[:-1]
    if not leading:
        return tf.reshape(y, (outputs,))
    if None in leading[1:]:
        return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [outputs]], axis=0))
    return tf.reshape(y, (-1, *leading[1:], outputs))


def _frozen_product(layer, inputs, training=None):
    # The kernel in the compute dtype (Keras' autocast) for the forward product only. A read
    # nothing waits for runs when the step starts (TensorFlow's executor runs what is ready):
    # the forward's casts are all made then and freed as the forward pass uses them, before
    # the backward pass, whose own casts wait for its gradients (below); waiting for the input
    # here too saved no peak and made the forward pass wait. Not training (an evaluation),
    # the read waits for the layer's input: there, with int4's dequantization op by op, every
    # layer's float32 temporaries came at once (SmolLM2's dev score peaked 260 MiB above its
    # steps); compiled now (`_int4_kernel`), a layer's kernels are still made only when its
    # input is. A tensor, not the variable: a variable read inside a custom gradient's
    # function asks it for a gradient.
    with contextlib.nullcontext() if training else tf.control_dependencies([inputs]):
        kernel = frozen_kernel(layer)

    @ops.custom_gradient
    def product(x):
        def gradient(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            with tf.control_dependencies([upstream]):  # read again when the backward pass is here
                again = frozen_kernel(layer)
            return layer._backward(upstream, again)

        return layer._product(x, kernel), gradient

    return product(inputs)


def frozen_kernel(layer):
    """The kernel `layer` multiplies by, in its compute dtype: a float kernel cast (a tensor, not
    the variable), an int8 one dequantized as Keras' int8 call does."""
    mode = getattr(layer, "quantization_mode", None)
    dtype = layer.compute_dtype
    if mode is None:
        return ops.cast(tf.convert_to_tensor(layer._kernel.value), dtype)
    if mode == "int4":
        scale, zero = (ops.cast(v, "float32") for v in (layer.kernel_scale, layer.kernel_zero))  # Keras' zero: int8
        dequantize = _int4_compiled if tf.inside_function() else _int4_kernel
        flat = dequantize(tf.convert_to_tensor(layer._kernel), scale, zero, _int4_columns(layer), dtype)
        return tf.reshape(flat, getattr(layer, "original_kernel_shape", flat.shape))
    scale = ops.cast(layer.kernel_scale, dtype)  # int8: in the compute dtype, as Keras' call reads it
    if isinstance(layer, keras.layers.EinsumDense):
        scale = layer._adjust_scale_for_dequant(scale)
    return ops.divide(ops.cast(layer._kernel, dtype), scale)


def _int4_kernel(packed, scale, zero, columns, dtype):
    # Keras' arithmetic (its `dequantize_with_sz_map`): (code - zero) * scale in float32, cast
    # to the compute dtype, the block of a row its index // block size; here by a reshape.
    # In a graph (a training step, an evaluation) one XLA computation, whatever the step's
    # kernels (`xla_modes`): the same numbers, with no float32 temporary. Op by op, an
    # evaluation's dequantizations and their twenty-odd ops each took 230 MiB more than the
    # training steps of a SmolLM2 run on an int4 base.
    codes = keras.quantizers.unpack_int4(packed, columns, axis=-1, dtype="int8")
    blocks, outputs = scale.shape
    grouped = tf.reshape(tf.cast(codes, "float32"), (blocks, -1, outputs))
    return tf.cast(tf.reshape((grouped - zero[:, None]) * scale[:, None], (-1, outputs)), dtype)


_int4_compiled = tf.function(_int4_kernel, jit_compile=True, autograph=False)


def _int4_columns(layer):
    """The unpacked kernel's columns (Keras packs two a byte along them)."""
    if isinstance(layer, keras.layers.EinsumDense):
        return layer._int4_unpacked_column_size
    return layer._orig_output_dim


def _int4_in_blocks(layer):
    """Whether `layer`'s int4 kernel has a scale and zero point for each block of whole rows
    (Keras' sub-channel layout, its rows a multiple of the block), which `_int4_kernel` reads."""
    block = getattr(layer, "_int4_block_size", None)
    if block in (None, -1) or getattr(layer, "kernel_zero", None) is None:
        return False
    return layer.kernel_scale.shape[0] * block == layer._kernel.shape[0]


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
    """Each of `layers` whose kernel is frozen (float, int8, or int4 in blocks of rows), of
    Keras' own Dense or EinsumDense, given the lean call (its class swapped for the subclass;
    its weights untouched). Returns how many were."""
    swapped = 0
    for layer in layers:
        lean = LEAN.get(type(layer))
        mode = getattr(layer, "quantization_mode", None)
        if lean is None or mode not in (None, "int8", "int4") or layer._kernel.trainable:
            continue
        if mode == "int4" and not _int4_in_blocks(layer):
            continue
        if getattr(layer, "inputs_quantizer", None) is not None:  # int8 activations too: Keras' call
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
