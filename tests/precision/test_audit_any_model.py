"""`amptrain.audit` on a user's own Keras model (a builder or a built model): the classic
recipe's float32 CustomAttention is an island with its reason, and each float16 risk the
audit knows is named at the custom layer that has it. (The config form: `test_audit.py`.)"""

import pathlib
import sys

import keras
import pytest
import tensorflow as tf
from keras import ops

import amptrain
from amptrain.errors import UserError

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "classic_recipe"))
import classic_recipe  # noqa: E402  (the worked example, not a package)


def classic(policy):
    """The classic recipe's model, tiny: vocabulary 64, 16 positions, hidden 16."""
    return classic_recipe.build_transformer_model(policy, vocabulary_size=64, max_length=16, hidden_dim=16)


def found(report):
    return {(risk["kind"], risk["layer"]) for risk in report["risks"]}


def test_the_classic_recipe_shows_custom_attention_as_a_float32_island_with_its_reason():
    report = amptrain.audit(classic, policy="mixed_float16")
    rows = {row["path"]: row for row in report["rows"]}
    attention = rows["custom_attention"]
    assert (attention["class"], attention["compute_dtype"], attention["variable_dtype"]) == (
        "CustomAttention",
        "float32",
        "float32",
    )
    assert attention["island"] and attention["reason"] == "declared float32 by its constructor (dtype='float32')"
    assert rows["custom_attention/mha/query"]["reason"] == "inside the float32 island custom_attention"
    assert rows["logits"]["island"] and rows["ffn_in"]["compute_dtype"] == "float16"
    assert not rows["ffn_in"]["island"]
    assert report["risks"] == [] and report["loss_scale"] == "dynamic"


class HalfSoftmax(keras.layers.Layer):
    """The unsafe variant: self-attention weights from a softmax in the compute dtype."""

    def call(self, x, padding_mask):
        scores = ops.einsum("bqd,bkd->bqk", x, x)
        return ops.einsum("bqk,bkd->bqd", ops.softmax(scores, axis=-1), x)


class HalfNorm(keras.layers.Layer):
    """A hand-written layer norm: its variance and reciprocal square root in the compute dtype."""

    def call(self, x, padding_mask):
        centred = x - ops.mean(x, axis=-1, keepdims=True)
        return centred * ops.rsqrt(ops.mean(ops.square(centred), axis=-1, keepdims=True) + 1e-3)


class CastsToFloat32(keras.layers.Layer):
    """Follows the policy by its dtype, ignores it in call: computes in float32."""

    def call(self, x, padding_mask):
        return ops.tanh(ops.cast(x, "float32"))


class UncastIsland(keras.layers.Layer):
    """Pinned to float32, but Keras' input cast is off: its float16 input is used as it is."""

    def __init__(self, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self._convert_input_args = False

    def call(self, x, padding_mask):
        return ops.tanh(x)


class SumOverSequence(keras.layers.Layer):
    """A hand-written pooling: the sum over the positions in the compute dtype."""

    def call(self, x, padding_mask):
        return x + ops.sum(x, axis=1, keepdims=True)


def variant(attention, hidden=16):
    """A builder of the recipe's shape with `attention` (a layer class) in CustomAttention's place."""

    def build(policy):
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        x = keras.layers.Embedding(64, 16, name="token_embedding")(token_ids)
        x = attention(name="attention")(x, ops.not_equal(token_ids, 0))
        x = keras.layers.Dense(hidden, name="ffn")(x)
        x = keras.layers.GlobalAveragePooling1D(name="pooling")(x)
        return keras.Model({"token_ids": token_ids}, keras.layers.Dense(2, dtype="float32", name="logits")(x))

    return build


@pytest.mark.parametrize(
    ("layer", "risk", "says"),
    [
        (HalfSoftmax, "fp16_softmax", "Softmax in float16"),
        (HalfNorm, "fp16_norm", "Rsqrt, Square in float16: layer-norm arithmetic"),
        (CastsToFloat32, "ignored_policy", "runs Tanh in float32 under mixed_float16 without declaring"),
        (UncastIsland, "fp16_into_island", "a float32 island fed float16 with no cast: Tanh run in float16"),
    ],
)
def test_an_unsafe_custom_layer_gets_its_risk_named(layer, risk, says):
    report = amptrain.audit(variant(layer), policy="mixed_float16")
    assert found(report) == {(risk, "attention")}
    assert report["risks"][0]["message"].startswith(says)


def test_a_long_sum_in_float16_is_named_only_when_the_inputs_make_it_long():
    assert amptrain.audit(variant(SumOverSequence), policy="mixed_float16")["risks"] == []  # traced length 8
    inputs = {"token_ids": tf.TensorSpec((2, 512), tf.int32)}
    report = amptrain.audit(variant(SumOverSequence), policy="mixed_float16", inputs=inputs)
    assert found(report) == {("fp16_reduction", "attention")}
    assert report["risks"][0]["message"].startswith("Sum over 512 elements in float16")


def test_no_loss_scaling_and_misaligned_sizes_are_named_on_a_users_model():
    report = amptrain.audit(variant(HalfSoftmax, hidden=12), policy="mixed_bfloat16", loss_scale="none")
    assert report["risks"] and found(report) == {("size_alignment", "ffn")}  # bfloat16: the softmax is a note
    assert ("bf16_softmax", "attention") in {(note["kind"], note["layer"]) for note in report["notes"]}
    report = amptrain.audit(classic, policy="mixed_float16", loss_scale="none")
    assert found(report) == {("no_loss_scale", None)}


def test_a_model_built_outside_the_policy_is_flagged_layer_by_layer():
    built = classic("float32")  # the global policy is float32 here
    report = amptrain.audit(built, policy="mixed_float16")
    flagged = {layer for kind, layer in found(report) if kind == "ignored_policy"}
    assert {"custom_attention", "ffn_in", "token_embedding"} <= flagged
    keras.config.set_dtype_policy("mixed_float16")
    try:
        under = classic("mixed_float16")
    finally:
        keras.config.set_dtype_policy("float32")
    assert amptrain.audit(under)["risks"] == []  # its policy is its own, and its float32 layers are declared


def test_what_is_not_a_model_is_one_line():
    with pytest.raises(UserError, match="not a keras.Model"):
        amptrain.audit(lambda policy: keras.layers.Dense(2), policy="mixed_float16")
    with pytest.raises(UserError, match="policy= is required"):
        amptrain.audit(classic)
    with pytest.raises(UserError, match="received int"):
        amptrain.audit(3, policy="float32")
    with pytest.raises(UserError, match="overrides are a config's"):
        amptrain.audit(classic, ["train.steps=2"], policy="float32")


def test_the_commonest_model_with_default_names_has_no_risk_that_is_not_there():
    """Dense(8) then a float32 Dense(2), Keras's own names: the second runs in float32. Its
    ops once traced under the first's name scope (TensorFlow makes a graph's scopes unique:
    `dense` under `dense_1`) and it was reported as a float32 island fed float16."""

    def build(policy):
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(8, dtype=policy)(inputs)
        return keras.Model(inputs, keras.layers.Dense(2, dtype="float32")(hidden))

    report = amptrain.audit(build, policy="mixed_float16")
    assert found(report) == set()
    rows = {row["path"]: row for row in report["rows"]}
    # made in that order: Keras numbers them (dense_9 before dense_10: by length, then name)
    first, second = (rows[name] for name in sorted(rows, key=lambda name: (len(name), name)))
    assert first["compute_dtype"] == "float16" and set(first["float32_ops"]) == set()
    assert second["island"] and set(second["float32_ops"]) == {"MatMul", "BiasAdd"}
