"""The frozen base of a LoRA run held as `train.base_weights` says: float32 (as loaded), in the
compute dtype, or its projections quantized to int8 or int4 with Keras' own quantization
(QLoRA's idea: the weights no gradient reaches need not be held in 32 bits).

    backbone = load_base(family, folder, mode, dtype, dropout=0.0, name="decoder")  # the model's
    computed_kernel(layer)         # a projection's kernel as its call computes it (dequantized, adapters in)
    copy_computed_kernels(model, twin)   # a float32 twin given those kernels (what an export writes)

int8: each projection's kernel (query, key, value, output, gate, up, down of every decoder
layer) as int8 with a scale an output channel, weight-only (the activations stay in the
compute dtype: Keras' `Int8QuantizationConfig(activation_quantizer=None)`). int4: two values a
byte, a float32 scale and zero point for each 32 inputs of an output channel, in Keras' int4
layer and call (`Int4QuantizationConfig(block_size=32)`) but with the zero point float, so that
a block keeps its minimum: llama.cpp's Q4_1 (`int4_blocks`). Both are made from the file's
float32 weights (the run's and its float32 export's quantization are the same). The token
embedding (the tied output layer too) and the norms are kept as loaded, in the run's variable
dtype.
The float32 model is never whole while a quantized base loads: the backbone is built with its
float variables deferred (shapes, no memory: `load_backbone`'s `place`), and each weight read
from the file becomes its variable (a projection's kernel quantized at once: `Placement`).
"compute": every frozen weight loaded in the compute dtype (bfloat16 under mixed_bfloat16:
the model built under the compute dtype's own policy), the projections then put back under
the run's policy so that their adapters, and the adapters' slots, are float32.
"""

import contextlib
import gc
import math

import keras
import numpy as np

from amptrain.models.families.loading import load_backbone
from amptrain.tasks.language_model.lora import every_projection

QUANTIZED = ("int8", "int4")
INT4_BLOCK = 32  # inputs a scale and zero point: llama.cpp's Q4_0 and Q4_1 blocks
PLACEHOLDER_DTYPE = "bfloat16"  # the policy a quantized base is built under, its variables deferred


def load_base(family, path, mode, dtype, **options):
    """The family's keras-hub backbone of the folder `path` under the run's policy `dtype`, its
    frozen weights held as `mode` says ("float32": as loaded). `options`: the backbone's own."""
    policy = keras.dtype_policies.get(dtype)
    if mode in QUANTIZED and policy.compute_dtype == "float16":
        from amptrain.errors import ConfigError

        raise ConfigError(
            f"train.base_weights: {mode} under {policy.name}: Keras quantizes for float32 or bfloat16 compute; "
            "expected precision.policy float32 or mixed_bfloat16"
        )
    if mode not in QUANTIZED:
        load = policy.compute_dtype if mode == "compute" else dtype  # a variable's dtype is fixed when made
        backbone = load_backbone(family, path, dtype=load, **options)
        if mode == "compute":  # built in the compute dtype; the adapters to come in the run's policy
            for layer in every_projection(backbone.transformer_layers, family):
                layer.dtype_policy = policy
        return backbone
    placement = Placement(family, mode, policy)
    with _collecting_once():
        backbone = load_backbone(family, path, place=placement.start, dtype=PLACEHOLDER_DTYPE, **options)
        placement.finish()
    gc.collect()
    return backbone


class Placement:
    """Puts each weight the converter reads into the backbone (built under bfloat16, its float
    variables deferred: placeholders without memory; given by `start`): the placeholder
    dropped, a variable of the run's policy made from the value, and a projection's kernel
    quantized from it at once; `finish` (once the converter is done) makes what the file did
    not hold from its initializer and puts every layer under the run's policy."""

    def __init__(self, family, mode, policy):
        self.family, self.mode, self.policy = family, mode, policy

    def start(self, backbone):
        """Takes the built `backbone`'s placeholders; returns the function that places a weight."""
        self.backbone = backbone
        self.owners = {}  # id(variable) -> [(layer, attribute)]
        for layer in backbone._flatten_layers(include_self=True):
            for attribute, value in vars(layer).items():
                if isinstance(value, keras.Variable) and "float" in value.dtype:
                    self.owners.setdefault(id(value), []).append((layer, attribute))
        self.kernels = {id(layer._kernel) for layer in every_projection(backbone.transformer_layers, self.family)}
        return self

    def __call__(self, variable, value):
        owners = self.owners.pop(id(variable), None)
        if owners is None:
            raise ValueError(f"{variable.path}: the converter gave this weight twice, or it is not the backbone's")
        self._place(owners, value, quantize=id(variable) in self.kernels)

    def _place(self, owners, value, quantize=False):
        new = None
        for layer, attribute in owners:  # one variable, however many layers hold it
            if layer.dtype_policy.name == PLACEHOLDER_DTYPE:  # not one keras-hub sets (float32 norms)
                layer.dtype_policy = self.policy
            new = _remake(layer, attribute, value, layer.variable_dtype, made=new)
            if quantize:
                quantize_projection(layer, self.mode)

    def finish(self):
        for owners in list(self.owners.values()):  # none in the families' files: their initializers' values
            layer, attribute = owners[0]
            self._place(owners, np.asarray(getattr(layer, attribute).numpy()))
        self.owners = {}
        for layer in self.backbone._flatten_layers(include_self=True):
            if layer.dtype_policy.name == PLACEHOLDER_DTYPE:
                layer.dtype_policy = self.policy


def _remake(layer, attribute, value, dtype, made=None):
    """The layer's variable `attribute` replaced by one of `dtype` made from `value` (or by
    `made`, the variable another layer's attribute was given); returns the new variable."""
    old = getattr(layer, attribute)
    delattr(layer, attribute)  # Keras untracks it
    locked = layer._tracker.locked  # a built layer's; unlocked as Keras' own quantize does
    layer._tracker.unlock()
    try:
        if made is None:  # made from the value: one copy, not zeros and another
            made = layer.add_weight(name=old.name, shape=value.shape, dtype=dtype,
                                    initializer=_holding(value), trainable=old.trainable)  # fmt: skip
        setattr(layer, attribute, made)
    finally:
        if locked:
            layer._tracker.lock()
    return made


def _holding(value):
    """An initializer giving `value`."""
    return lambda shape, dtype: keras.ops.convert_to_tensor(value, dtype)


def quantize_projection(layer, mode):
    """`layer`'s float kernel quantized as the base's `mode` holds it (Keras' layer and call)."""
    from keras.quantizers import Int4QuantizationConfig, Int8QuantizationConfig

    layer.float_kernel_shape = tuple(layer._kernel.shape)  # for computed_kernel
    if mode == "int8":
        layer.quantize("int8", config=Int8QuantizationConfig(activation_quantizer=None))
        return
    kernel = np.asarray(layer._kernel.numpy(), np.float32)
    layer.quantize("int4", config=Int4QuantizationConfig(block_size=INT4_BLOCK))  # Keras' layout and call
    rows = layer._kernel.shape[0]  # the reduced axes (Keras packs a kernel as (inputs, outputs / 2))
    codes, scale, zero = int4_blocks(kernel.reshape(rows, -1), INT4_BLOCK)
    layer._kernel.assign(keras.quantizers.pack_int4(codes, axis=-1)[0])
    layer.kernel_scale.assign(scale)
    _remake(layer, "kernel_zero", zero, "float32")  # Keras' is an int8: its minimum rounded to a step


def int4_blocks(kernel, block):
    """(codes in [-8, 7] of `kernel`'s shape, scales, zero points: (blocks, outputs)) of a
    (inputs, outputs) kernel, each `block` inputs of an output channel mapped from its minimum
    to its maximum in 15 steps; Keras' int4 call computes (code - zero) * scale. The zero point
    is float: `code * scale + minimum` is llama.cpp's Q4_1, exact for weights already on such
    a grid (SmolLM2's, converted from a Q4_1 file), where Keras' integer zero point moves each
    block by up to half a step."""
    inputs, outputs = kernel.shape
    blocks = -(-inputs // block)
    padded = np.concatenate([kernel, np.repeat(kernel[-1:], blocks * block - inputs, 0)])  # the last block's own values
    grouped = padded.reshape(blocks, block, outputs)
    low, high = grouped.min(axis=1), grouped.max(axis=1)
    scale = np.where(high > low, (high - low) / 15, 1).astype(np.float32)
    codes = np.clip(np.round((grouped - low[:, None]) / scale[:, None]), 0, 15) - 8
    zero = (-8 - low / scale).astype(np.float32)
    return codes.reshape(-1, outputs)[:inputs].astype(np.int8), scale, zero


@contextlib.contextmanager
def _collecting_once():
    """Keras collects garbage each time a layer drops a variable (`Layer.__delattr__`): with
    TensorFlow's objects alive a quarter of a second, 50 s for SmolLM2's 210 kernels. The
    placement drops one a weight and collects once, at its end."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


def projection_layers(model):
    """Every projection of every decoder layer (the family's seven names)."""
    return every_projection(model.blocks, model.family)


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
