"""A LoRA run's frozen projections computed as x K + (alpha / rank) (x A) B, the kernel's cast
read again for the input's gradient: the same outputs and gradients as Keras' own layers
(which multiply by the merged kernel), the output bit for bit without adapters; swapped in by the
adapters and out again by the export's merge."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from pretrained.test_transformers_export import lora_task

from amptrain.tasks.language_model.base_weights import projection_layers
from amptrain.tasks.language_model.lora import merge_lora
from amptrain.tasks.language_model.projections import (
    LeanDense,
    LeanEinsumDense,
    frozen_kernel,
    input_gradient_equation,
    lean_projections,
)


def pair(kind, policy, inputs=8):
    """(Keras' layer, the same weights in the lean one), built on (2, 3, inputs) inputs."""
    made = []
    for _ in range(2):
        if kind == "dense":
            layer = keras.layers.Dense(6, use_bias=True, dtype=policy)
        else:
            layer = keras.layers.EinsumDense("bte,enh->btnh", (None, 2, 3), bias_axes="nh", dtype=policy)
        layer.build((2, 3, inputs))
        made.append(layer)
    keras_layer, lean = made
    rng = np.random.RandomState(0)
    for a, b in zip(keras_layer.weights, lean.weights):
        value = rng.normal(0, 0.5, a.shape).astype(np.float32)
        a.assign(value)
        b.assign(value)
    return keras_layer, lean


def outputs_and_gradients(layer, x):
    variables = [v for v in layer.weights if v.trainable]
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        weights = tf.reshape(tf.cast(tf.range(tf.size(y)), tf.float32), tf.shape(y)) / 100
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
    return [np.asarray(t, np.float32) for t in [y, *tape.gradient(loss, [x, *variables])]]


@pytest.mark.parametrize("kind", ["dense", "einsum"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_a_frozen_projection_computes_what_keras_does(kind, policy):
    x = tf.constant(np.random.RandomState(1).normal(0, 1, (2, 3, 8)), keras.dtype_policies.get(policy).compute_dtype)
    ours, theirs = pair(kind, policy)
    for layer in (ours, theirs):
        for v in layer.weights:
            v.trainable = False
    assert lean_projections([ours]) == 1 and type(ours) in (LeanDense, LeanEinsumDense)
    (y, *gradients), (expected, *theirs_gradients) = outputs_and_gradients(ours, x), outputs_and_gradients(theirs, x)
    assert np.array_equal(y, expected)  # no adapters: the same product, bit for bit
    for a, b in zip(gradients, theirs_gradients):  # the input's, summed in another order than TensorFlow's
        assert np.abs(a - b).max() <= 1e-6 * np.abs(b).max()
    for layer in (ours, theirs):
        layer.enable_lora(2, lora_alpha=4)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b):
            v.assign(np.random.RandomState(2).normal(0, 0.5, v.shape).astype(np.float32))
    tolerance = 1e-5 if policy == "float32" else 3e-2  # the merged kernel is rounded to bfloat16 whole
    for a, b in zip(outputs_and_gradients(ours, x), outputs_and_gradients(theirs, x)):
        assert a.shape == b.shape and np.abs(a - b).max() <= tolerance * max(np.abs(b).max(), 1)


@pytest.mark.parametrize("kind", ["dense", "einsum"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_an_int8_projection_computes_what_keras_does(kind, policy):
    """Keras' int8 Dense scales the product, the lean call the kernel: the same to rounding
    (under mixed_bfloat16, against Keras' layer in float32: its own int8 gradient for a bfloat16
    input fails in eager mode)."""
    from keras.quantizers import Int8QuantizationConfig

    ours, _ = pair(kind, policy)
    _, theirs = pair(kind, "float32")
    x = tf.constant(np.random.RandomState(1).normal(0, 1, (2, 3, 8)), "float32")
    for layer in (ours, theirs):
        layer.quantize("int8", config=Int8QuantizationConfig(activation_quantizer=None))
        layer.enable_lora(2, lora_alpha=4)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b):
            v.assign(np.random.RandomState(2).normal(0, 0.5, v.shape).astype(np.float32))
        for v in layer.weights:
            v.trainable = "lora" in v.path
    assert lean_projections([ours]) == 1
    tolerance = 1e-5 if policy == "float32" else 3e-2  # the scale applied to the kernel, not the product
    for a, b in zip(outputs_and_gradients(ours, x), outputs_and_gradients(theirs, x)):
        assert a.shape == b.shape and np.abs(a - b).max() <= tolerance * max(np.abs(b).max(), 1)


@pytest.mark.parametrize("kind", ["dense", "einsum"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_an_int4_projection_in_blocks_computes_what_keras_does(kind, policy):
    """Keras' int4 call dequantizes with each row's block scale and zero point gathered, the
    lean one by a reshape of the rows into blocks: the same kernel, so the same outputs and
    input gradient bit for bit; adapters' gradients to rounding. Rows not a whole number of
    blocks keep Keras' call."""
    from keras.quantizers import Int4QuantizationConfig

    ours, theirs = pair(kind, policy, inputs=64)
    x = tf.constant(np.random.RandomState(1).normal(0, 1, (2, 3, 64)), ours.compute_dtype)
    for layer in (ours, theirs):
        layer.quantize("int4", config=Int4QuantizationConfig(block_size=16))
        for v in layer.weights:
            v.trainable = False
    assert lean_projections([ours]) == 1
    for a, b in zip(outputs_and_gradients(ours, x), outputs_and_gradients(theirs, x)):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-6 * np.abs(b).max()
    in_a_graph = tf.function(lambda: frozen_kernel(ours), autograph=False)  # one XLA computation
    graph = in_a_graph.get_concrete_function().graph
    assert any(op.node_def.attr["_XlaMustCompile"].b for op in graph.get_operations())
    assert np.array_equal(in_a_graph().numpy(), frozen_kernel(ours).numpy())
    for layer in (ours, theirs):
        layer.enable_lora(2, lora_alpha=4)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b):
            v.assign(np.random.RandomState(2).normal(0, 0.5, v.shape).astype(np.float32))
    tolerance = 1e-5 if policy == "float32" else 3e-2
    for a, b in zip(outputs_and_gradients(ours, x), outputs_and_gradients(theirs, x)):
        assert a.shape == b.shape and np.abs(a - b).max() <= tolerance * max(np.abs(b).max(), 1)
    uneven, _ = pair(kind, policy, inputs=40)
    uneven.quantize("int4", config=Int4QuantizationConfig(block_size=16))
    uneven.trainable = False
    assert lean_projections([uneven]) == 0


def test_the_input_gradient_equation():
    assert input_gradient_equation("bte,enh->btnh") == "btnh,enh->bte"
    assert input_gradient_equation("btnh,nhe->bte") == "bte,nhe->btnh"
    assert input_gradient_equation("bti,j->bj") is None  # t and i summed within the input alone
    assert input_gradient_equation("...i,io->...o") is None


def test_the_adapters_swap_the_projections_in_and_the_merge_out(tmp_path):
    _, model = lora_task(tmp_path, "llama3")
    layers = projection_layers(model)
    assert {type(layer) for layer in layers} == {LeanDense, LeanEinsumDense}
    merge_lora(model)
    assert {type(layer) for layer in layers} == {keras.layers.Dense, keras.layers.EinsumDense}
