"""The precision audit: the classifier is clean under every policy and shows its float32
islands; deliberately bad models are flagged with the right kind at the right layer."""

import json

import keras
import pytest
import tensorflow as tf
from keras import ops

import amptrain
from amptrain import api, cli
from amptrain.models.blocks import MultiHeadSelfAttention
from amptrain.models.islands import float32_island
from amptrain.precision.audit import audit_model, format_report

POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]
ISLANDS = {
    "block_0/attention_norm",
    "block_0/attention",
    "block_0/ffn_norm",
    "final_norm",
    "pooling",
    "head_dropout",
    "logits",
}


def found(report):
    return {(risk["kind"], risk["layer"]) for risk in report["risks"]}


@pytest.mark.parametrize("policy", POLICIES)
def test_the_classifier_has_no_risk_and_shows_its_islands_with_reasons(tiny, policy):
    report = api.audit(tiny / "tiny.toml", policy=policy)
    assert report["risks"] == []
    islands = {row["path"]: row["reason"] for row in report["rows"] if row["island"]}
    assert set(islands) == ISLANDS and all(islands.values())
    rows = {row["path"]: row for row in report["rows"]}
    assert rows["block_0/ffn_in"]["compute_dtype"] == keras.DTypePolicy(policy).compute_dtype
    assert rows["logits"]["compute_dtype"] == "float32"
    assert {row["variable_dtype"] for row in report["rows"]} == {"float32", "-"}
    if policy != "float32":  # the graph shows what the islands declare
        assert {"Softmax", "SelectV2"} <= set(rows["block_0/attention"]["float32_ops"])
        assert "Rsqrt" in rows["final_norm"]["float32_ops"]


# === Deliberately bad models ===


class HalfSoftmaxAttention(keras.layers.Layer):
    """One-head self-attention whose masked softmax runs in the compute dtype (the bug)."""

    def __init__(self, mask="where", **kwargs):
        super().__init__(**kwargs)
        self.mask = mask

    def call(self, x, padding_mask):
        scores = ops.einsum("bqd,bkd->bqk", x, x)
        keep = padding_mask[:, None, :]
        if self.mask == "where":
            scores = ops.where(keep, scores, -1e9)
        elif self.mask == "cast":
            scores = ops.where(keep, scores, ops.cast(-1e9, scores.dtype))
        else:  # additive: (1 - keep) * -1e9, and 0 * -inf is NaN on every kept key
            scores = scores + (1.0 - ops.cast(keep, scores.dtype)) * -1e9
        return ops.einsum("bqk,bkd->bqd", ops.softmax(scores, axis=-1), x)


class HalfLayerNorm(keras.layers.Layer):
    """A hand-written layer norm computing its statistics in the compute dtype (the bug)."""

    def call(self, x):
        mean = ops.mean(x, axis=-1, keepdims=True)
        variance = ops.mean(ops.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * ops.rsqrt(variance + 1e-6)


def small_model(policy="mixed_float16", attention=None, norm=None, logits_dtype="float32", cast_logits=False):
    """Embedding, attention, a norm, mean pooling and logits: the classifier's shape in small."""
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
    x = keras.layers.Embedding(64, 16, dtype=policy, name="embedding")(token_ids)
    attention = attention or MultiHeadSelfAttention(16, 2, dtype=policy, name="attention")
    x = attention(x, padding_mask=padding_mask)
    x = (norm or keras.layers.LayerNormalization(dtype=policy, name="norm"))(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=policy, name="pooling")(x)
    x = float32_island(keras.layers.Dense(2, dtype=logits_dtype, name="logits"), "test logits")(x)
    if cast_logits:
        x = float32_island(keras.layers.Activation("linear", dtype="float32", name="to_float32"), "a cast")(x)
    return keras.Model({"token_ids": token_ids, "padding_mask": padding_mask}, x, name="small")


def test_a_well_made_small_model_has_no_risk():
    assert audit_model(small_model(), "mixed_float16")["risks"] == []


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # -1e9 made fp16: the bug
@pytest.mark.parametrize("mask", ["where", "cast", "additive"])
def test_fp16_softmax_and_its_out_of_range_mask_are_flagged_at_the_attention(mask):
    model = small_model(attention=HalfSoftmaxAttention(mask, dtype="mixed_float16", name="attention"))
    report = audit_model(model, "mixed_float16")
    assert found(report) == {("fp16_softmax", "attention"), ("fp16_mask_range", "attention")}
    assert "Softmax in float16" in format_report(report)


def test_under_bfloat16_the_same_softmax_is_a_note_not_a_risk():
    model = small_model("mixed_bfloat16", attention=HalfSoftmaxAttention(dtype="mixed_bfloat16", name="attention"))
    report = audit_model(model, "mixed_bfloat16")
    assert report["risks"] == []
    assert ("bf16_softmax", "attention") in {(note["kind"], note["layer"]) for note in report["notes"]}


@pytest.mark.parametrize("cast_logits", [False, True])
def test_fp16_logits_are_flagged_even_when_cast_to_float32_afterwards(cast_logits):
    report = audit_model(small_model(logits_dtype="mixed_float16", cast_logits=cast_logits), "mixed_float16")
    # 2 classes in a float16 matmul is also a tensor-core misfit.
    assert found(report) == {("fp16_logits", "logits"), ("size_alignment", "logits")}


def test_a_loss_computed_in_fp16_is_flagged():
    def half_loss(targets, logits):
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, tf.cast(logits, tf.float16)))

    report = audit_model(small_model(), "mixed_float16", loss_fn=half_loss, targets=tf.TensorSpec((None,), tf.int32))
    assert found(report) == {("fp16_loss", "loss")}
    # TensorFlow runs the cross-entropy itself in float32 and casts back: the sum is what runs in float16.
    assert report["risks"][0]["message"].startswith("Sum in float16")


def test_fp16_layer_norm_arithmetic_is_flagged():
    report = audit_model(small_model(norm=HalfLayerNorm(dtype="mixed_float16", name="norm")), "mixed_float16")
    # Its means run in float32 (keras.ops.mean upcasts inside a cast pair): not flagged as ignoring the policy.
    assert found(report) == {("fp16_norm", "norm")}
    assert report["risks"][0]["message"].startswith("Rsqrt, Square in float16")


def test_layers_that_ignored_the_policy_are_flagged():
    model = small_model(norm=keras.layers.Dense(16, name="forgot_dtype"))  # float32 without a reason
    assert found(audit_model(model, "mixed_float16")) == {("ignored_policy", "forgot_dtype")}
    model = small_model(norm=keras.layers.Dense(16, dtype="float16", name="half_variables"))
    assert ("ignored_policy", "half_variables") in found(audit_model(model, "mixed_float16"))


# === Config checks, and the command ===


def test_fp16_without_loss_scaling_is_flagged(tiny):
    # amptrain.audit with a path (a PathLike) is the config form, as it was before it took a model too.
    report = amptrain.audit(tiny / "tiny.toml", ["precision.loss_scale=none"], policy="mixed_float16")
    assert found(report) == {("no_loss_scale", None)} and report["config"] == str(tiny / "tiny.toml")


def test_sizes_that_are_no_multiple_of_8_are_risks_under_mixed_precision_only(tiny):
    report = api.audit(tiny / "tiny.toml", ["model.hidden_dim=20"], policy="mixed_bfloat16")
    sizes = [risk for risk in report["risks"] if risk["kind"] == "size_alignment"]
    assert sizes and set(found(report)) == {("size_alignment", risk["layer"]) for risk in sizes}
    hidden = [risk["message"] for risk in sizes if risk["message"].startswith("20 (model.hidden_dim)")]
    assert len(hidden) == 1 and "embedding/token_embedding" in hidden[0]
    float32 = audit_model(small_model("float32", norm=keras.layers.Dense(20, name="wide")), "float32")
    assert float32["risks"] == [] and {note["kind"] for note in float32["notes"]} == {"size_alignment"}


def test_the_command_prints_a_table_and_json_and_exits_1_on_risks(tiny, capsys):
    assert cli.main(["audit", str(tiny / "tiny.toml"), "--set", "precision.policy=mixed_float16"]) == 0
    text = capsys.readouterr().out
    assert "float32 island" in text and "risks: none" in text
    assert "pooling" in text and "MaskedMeanPooling" in text
    no_scaling = ["--set", "precision.policy=mixed_float16", "--set", "precision.loss_scale=none", "--json"]
    assert cli.main(["audit", str(tiny / "tiny.toml"), *no_scaling]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [risk["kind"] for risk in report["risks"]] == ["no_loss_scale"]
    assert report["policy"] == "mixed_float16" and report["rows"]


def test_a_config_error_exits_2(tiny, capsys):
    assert cli.main(["audit", str(tiny / "tiny.toml"), "--set", "model.num_heads=3"]) == 2
    assert "model.num_heads" in capsys.readouterr().err
