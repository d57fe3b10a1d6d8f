"""The frozen base of a LoRA run held as `train.base_weights` says: float32 (as loaded), in the
compute dtype, or its projections quantized to int8 or int4 with Keras' own quantization
(QLoRA's idea: the weights no gradient reaches need not be held in 32 bits).

    model = PretrainedLanguageModel(checkpoint, length, dropout, load_dtype(mode, dtype))
    hold_base(model, mode, dtype)  # after the weights are loaded, before the adapters
    computed_kernel(layer)         # a projection's kernel as its call computes it (dequantized, adapters in)
    copy_computed_kernels(model, twin)   # a float32 twin given those kernels (what an export writes)

int8: each projection's kernel (query, key, value, output, gate, up, down of every decoder
layer) as int8 with a scale an output channel, weight-only (the activations stay in the
compute dtype: Keras' `Int8QuantizationConfig(activation_quantizer=None)`). int4: two values a
byte, a scale and a zero point for each 128 inputs of an output channel (Keras' default
`Int4QuantizationConfig()`). Both are made from the float32 weights (the run's and its
float32 export's quantization are the same), layer by layer after loading: the float32 model
is whole once, while it loads. The token embedding (the tied output layer too) and the norms
are kept as loaded.
"compute": every frozen weight loaded in the compute dtype (bfloat16 under mixed_bfloat16:
the model built under the compute dtype's own policy), the projections then put back under
the run's policy so that their adapters, and the adapters' slots, are float32.
"""

import math

import keras
import numpy as np

from amptrain.tasks.language_model.lora import target_layers

QUANTIZED = ("int8", "int4")


def load_dtype(mode, dtype):
    """The policy the pretrained model is built and loaded under: the compute dtype's for
    "compute" (a variable's dtype is fixed when it is made), else the run's `dtype` (a quantized
    base is quantized from the float32 weights, so that the run and its float32 export quantize
    alike)."""
    return keras.dtype_policies.get(dtype).compute_dtype if mode == "compute" else dtype


def hold_base(model, mode, dtype):
    """Holds `model`'s frozen weights as `mode` says (nothing for "float32"); the kernels'
    float shapes are kept on the layers (`float_kernel_shape`) for `computed_kernel`.
    `dtype`: the run's policy (its compute dtype is the model's)."""
    if mode == "compute":  # built in the compute dtype; the adapters to come in the run's policy
        for layer in projection_layers(model):
            layer.dtype_policy = keras.dtype_policies.get(dtype)
        return
    if mode not in QUANTIZED:
        return
    compute = keras.dtype_policies.get(dtype).compute_dtype
    if compute == "float16":
        from amptrain.errors import ConfigError

        raise ConfigError(
            f"train.base_weights: {mode} under {keras.dtype_policies.get(dtype).name}: Keras quantizes for "
            "float32 or bfloat16 compute; expected precision.policy float32 or mixed_bfloat16"
        )
    from keras.quantizers import Int4QuantizationConfig, Int8QuantizationConfig

    for layer in projection_layers(model):
        layer.float_kernel_shape = tuple(layer._kernel.shape)
        if mode == "int8":
            layer.quantize("int8", config=Int8QuantizationConfig(activation_quantizer=None))
        else:
            layer.quantize("int4", config=Int4QuantizationConfig())  # groups of 128 inputs, Keras' default


def projection_layers(model):
    """Every projection of every decoder layer (the family's seven names)."""
    return target_layers(model, list(model.family.projections))


def is_quantized(layer):
    return getattr(layer, "quantization_mode", None) in QUANTIZED


def computed_kernel(layer):
    """The kernel (in its float shape, the layer's compute dtype) that `layer`'s call multiplies
    by, dequantized and with its adapters merged: the call's output for the identity, less its
    bias, without its activation (read off the call, so it is the call's arithmetic whatever the
    quantization)."""
    shape = layer.float_kernel_shape
    inputs, kernel, output = _subscripts(layer, len(shape))
    size = {axis: shape[kernel.index(axis)] for axis in kernel}
    reduced = [size[axis] for axis in inputs]
    identity = keras.ops.reshape(keras.ops.eye(math.prod(reduced), dtype=layer.compute_dtype), (1, -1, *reduced))
    activation = layer.activation
    layer.activation = None  # GPT-2's first feed-forward projection applies its GELU in its call
    try:
        probed = layer(identity) - layer(keras.ops.zeros_like(identity[:, :1]))
    finally:
        layer.activation = activation
    probed = keras.ops.reshape(probed, (*reduced, *[size[axis] for axis in output]))
    return keras.ops.einsum(f"{inputs}{output}->{kernel}", probed)


def _subscripts(layer, rank):
    """(the input's summed axes, the kernel's axes, the output's own axes) of the layer's
    einsum, batch and position axes left out (Dense: "i", "io", "o")."""
    equation = getattr(layer, "equation", None) or "bti,io->bto"
    inputs, rest = equation.split(",")
    kernel, output = rest.split("->")
    if inputs[:2] != output[:2] or len(kernel) != rank or sorted(inputs[2:] + output[2:]) != sorted(kernel):
        raise ValueError(f"{layer.path}: equation {equation}: expected (batch, position, ...) in and out")
    return inputs[2:], kernel, output[2:]


def copy_computed_kernels(model, twin):
    """Each projection of `twin` (the same checkpoint's model in float32, unquantized) set to
    `model`'s computed kernel: the twin computes what `model` does, from plain weights."""
    for ours, theirs in zip(projection_layers(model), projection_layers(twin)):
        theirs._kernel.assign(np.asarray(computed_kernel(ours), np.float32))
