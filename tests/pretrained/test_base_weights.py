"""A LoRA run's frozen base held in int8, int4 or the compute dtype (`train.base_weights`):
each decoder projection quantized by Keras (the embedding and norms as loaded), the adapters
float32 and trained; the kernel a projection's call multiplies by, read back, is its
dequantized kernel with the adapters merged; the float32 twin an export writes computes what
the quantized model computes; generation over the cache is the whole forward pass; a policy
Keras cannot quantize for and a base without LoRA are refused in one line."""

import numpy as np
import pytest
from pretrained.test_causal import folder
from pretrained.test_transformers_export import lora_task

from amptrain.bench.building import buildable_precisions
from amptrain.config import config_from_dict
from amptrain.errors import ConfigError
from amptrain.tasks.language_model import generation
from amptrain.tasks.language_model.base_weights import (
    computed_kernel,
    int4_blocks,
    load_base,
    projection_layers,
    quantize_projection,
)
from amptrain.tasks.language_model.lora import adapters
from amptrain.tasks.language_model.transformers_folder import float_twin


def features(length=12):
    ids = np.random.RandomState(0).randint(0, 300, (2, length)).astype(np.int32)
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "positions": np.tile(np.arange(length), (2, 1))}


# the other families' converters and layers (GPT-2's fused attention, Qwen2's biases, Gemma's norms)
SLOW_PLACEMENTS = [("int4", "llama3"), ("int8", "gpt2"), ("int8", "qwen2"), ("int4", "gemma")]


def randomized_adapters(model):
    rng = np.random.RandomState(1)
    for variable in adapters(model):
        variable.assign(rng.normal(0, 0.05, variable.shape).astype(np.float32))


# int4 on Gemma (keras-hub's cached call, no lean decoding) is slow; Llama's int8 decodes lean
@pytest.mark.parametrize("mode, family", [("int8", "llama3"), pytest.param("int4", "gemma", marks=pytest.mark.slow)])
def test_a_quantized_base_computes_its_float_twin_and_generates_as_its_forward_pass(tmp_path, mode, family):
    task, model = lora_task(tmp_path, family, base_weights=mode)
    layers = projection_layers(model)
    assert {layer.quantization_mode for layer in layers} == {mode}
    assert {v.dtype for v in adapters(model)} == {"float32"} and all(v.trainable for v in adapters(model))
    assert model.backbone.token_embedding.embeddings.dtype == "float32"  # as loaded
    assert model.base_weights.endswith(f" {mode}")  # the checkpoint names how its base was held
    randomized_adapters(model)
    query = layers[0]
    if mode == "int8":  # by hand: int8 values over their scale, and the adapters' product
        scale = np.asarray(query._adjust_scale_for_dequant(query.kernel_scale))
        product = np.tensordot(query.lora_kernel_a.numpy(), query.lora_kernel_b.numpy(), axes=1)
        expected = query._kernel.numpy() / scale + (query.lora_alpha / query.lora_rank) * product
        assert np.abs(np.asarray(computed_kernel(query)) - expected).max() < 1e-6
    twin = float_twin(model, task.checkpoint)
    assert {layer.quantization_mode for layer in projection_layers(twin)} == {None}
    ours, theirs = model(features()).numpy(), twin(features()).numpy()
    assert np.abs(ours - theirs).max() < 1e-4 * np.abs(ours).max()
    prompt = features()["token_ids"][0, :5]
    cached = generation.generate(model, prompt[None], [5], task.eod_id, generation.Settings(4)).numpy()[0]
    reference = generation.greedy_by_recomputing(model, prompt, task.eod_id, 4)
    assert generation.continuation(cached, 5, task.eod_id).tolist() == reference.tolist()


@pytest.mark.parametrize(
    "mode, family",
    [("int8", "llama3")] + [pytest.param(m, f, marks=pytest.mark.slow) for m, f in SLOW_PLACEMENTS],
)
def test_a_quantized_base_loads_as_the_float32_model_quantized_after_loading(mode, family):
    """Placed weight by weight from the file into a backbone of deferred variables, the base holds what
    Keras' quantization of the whole float32 model holds: the same variables, bit for bit."""
    from amptrain.config.pretrained import read_checkpoint
    from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

    checkpoint = read_checkpoint(folder(family))
    placed = PretrainedLanguageModel(checkpoint, 16, 0.0, "mixed_bfloat16", base_weights=mode)
    whole = PretrainedLanguageModel(checkpoint, 16, 0.0, "mixed_bfloat16")
    for layer in projection_layers(whole):
        quantize_projection(layer, mode)
    ours, theirs = sorted(placed.weights, key=lambda v: v.path), sorted(whole.weights, key=lambda v: v.path)
    assert [(v.path, v.dtype, tuple(v.shape)) for v in ours] == [(v.path, v.dtype, tuple(v.shape)) for v in theirs]
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(ours, theirs))
    assert {layer.dtype_policy.name for layer in placed.backbone._flatten_layers()} == {
        layer.dtype_policy.name for layer in whole.backbone._flatten_layers()
    }
    assert np.array_equal(placed(features()).numpy(), whole(features()).numpy())


def test_a_placed_base_holds_no_float_weight_until_it_is_read():
    """The backbone a placement takes has its float variables deferred (a shape and an
    initializer: no memory), its dropout's seed state made; Keras is left no deferred variable
    to allocate later, and a quantized base with dropout trains."""
    from keras.src.backend.common import global_state

    from amptrain.config.pretrained import read_checkpoint
    from amptrain.models.families.loading import load_backbone
    from amptrain.tasks.language_model.families import family_of
    from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

    checkpoint, seen = read_checkpoint(folder("llama3")), {}

    def place(backbone):
        seen["deferred"] = {v._value is None for v in backbone.weights if "float" in v.dtype}
        return lambda variable, value: seen.setdefault("read", []).append(variable.path)

    load_backbone(family_of(checkpoint), checkpoint.path, place=place, dtype="bfloat16", dropout=0.1)
    assert seen["deferred"] == {True} and len(seen["read"]) > 10
    assert global_state.get_global_attribute("uninitialized_variables", []) == []
    model = PretrainedLanguageModel(checkpoint, 16, 0.1, "mixed_bfloat16", base_weights="int8")
    assert not np.array_equal(model(features(), training=True).numpy(), model(features(), training=True).numpy())


def test_int4_keeps_each_blocks_minimum_so_a_kernel_on_q4_1s_grid_is_held_exactly():
    """Blocks of inputs from their minimum to their maximum in 15 steps, the zero point float:
    a block on such a grid (-0.25 + 0.1 k) comes back as it was, where Keras' integer zero
    point (round(2.5) = 2) would move it by half a step; any other block within half a step."""
    import keras

    column = np.array([-0.25, 0.05, 0.55, 1.25, 0.0, 0.3, 0.6, 0.9], np.float32)  # two blocks of 4
    codes, scale, zero = int4_blocks(column[:, None], 4)
    assert codes[:, 0].tolist() == [-8, -5, 0, 7, -8, -3, 2, 7]
    np.testing.assert_allclose(scale[:, 0], [0.1, 0.06], rtol=1e-6)
    np.testing.assert_allclose(zero[:, 0], [-5.5, -8.0], rtol=1e-6)
    dense = keras.layers.Dense(1, use_bias=False, dtype="float32")
    dense.build((None, 8))
    dense.kernel.assign(column[:, None])
    quantize_projection(dense, "int4")  # blocks of 32: one here, of 8 inputs
    half_step = 0.05 + 1e-6
    np.testing.assert_allclose(dense(np.eye(8, dtype=np.float32)).numpy()[:, 0], column, atol=half_step)
    grid = (np.arange(32) % 16 * 0.1 - 0.25).astype(np.float32)[:, None]
    dense = keras.layers.Dense(1, use_bias=False, dtype="float32")
    dense.build((None, 32))
    dense.kernel.assign(grid)
    quantize_projection(dense, "int4")
    np.testing.assert_allclose(dense(np.eye(32, dtype=np.float32)).numpy(), grid, atol=1e-6)
    assert dense.kernel_zero.dtype == "float32" and dense.quantization_mode == "int4"


def test_the_compute_dtype_base_is_bfloat16_under_its_adapters(tmp_path):
    task, _ = lora_task(tmp_path, "llama3", base_weights="compute")
    model = task.build_model("mixed_bfloat16")
    frozen = {v.dtype for v in model.weights if not v.trainable}
    assert frozen == {"bfloat16"} and {v.dtype for v in adapters(model)} == {"float32"}
    assert np.isfinite(model(features()).numpy()).all()


def test_a_base_keras_cannot_hold_or_without_adapters_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"train.base_weights: int4 under mixed_float16: Keras quantizes for"):
        load_base(None, folder("llama3"), "int4", "mixed_float16")  # refused before anything is built
    (tmp_path / "train.txt").write_text("In the beginning\n", encoding="utf-8")
    raw = {"task": "language_model", "data": {"train": str(tmp_path / "train.txt")}}
    raw["model"] = {"pretrained": folder("llama3")}
    with pytest.raises(ConfigError, match=r"train.base_weights: .*set train.lora_rank"):
        config_from_dict({**raw, "train": {"base_weights": "int8"}}, source=str(tmp_path))
    with pytest.raises(ConfigError, match=r"train.base_weights: expected one of float32, compute, int8, int4"):
        config_from_dict({**raw, "train": {"lora_rank": 2, "base_weights": "nf4"}}, source=str(tmp_path))
    quantized = config_from_dict({**raw, "train": {"lora_rank": 2, "base_weights": "int4"}}, source=str(tmp_path))
    every = ("float32", "mixed_bfloat16", "mixed_float16")
    assert buildable_precisions(quantized, every) == every[:2]  # what `bench` and `doctor --memory` try
