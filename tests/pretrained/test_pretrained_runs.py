"""Fine-tuning a pretrained encoder: the folder checks, the recipe (a head's own learning
rate, layer-wise decay, no decay on biases and norms), and every amptrain feature on the
tiny random BERT of tests/pretrained/tiny-bert/ (hidden 16, 2 layers, 441 pieces)."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import TINY_BERT, pretrained_config

import amptrain
from amptrain.config import ConfigError, load_config
from amptrain.engine.run_log import read_metrics


@pytest.fixture
def tiny_ner_pretrained(tiny_ner, tmp_path):
    path = tmp_path / "ner-pretrained.toml"
    path.write_text(pretrained_config((tiny_ner / "tiny.toml").read_text()))
    return path


def copy_checkpoint(tmp_path):
    folder = tmp_path / "bert"
    shutil.copytree(TINY_BERT, folder)
    return folder


# === The folder and config checks: one line naming the file and what was expected ===


def test_the_checkpoint_sets_the_model_shape_casing_and_vocabulary(tiny_pretrained):
    config = load_config(tiny_pretrained)
    m = config.model
    assert (m.num_layers, m.hidden_dim, m.num_heads, m.intermediate_dim) == (2, 16, 2, 32)
    assert m.pretrained == TINY_BERT


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.hidden_dim=64", "model.hidden_dim: 64 conflicts with the checkpoint"),
        ("data.max_length=256", "data.max_length: 256 is beyond the 128 positions of"),
        ("data.lowercase=false", "data.lowercase: False conflicts with the checkpoint"),
        ("task=translation", "model.pretrained: expected nothing for task 'translation'"),
    ],
)
def test_settings_that_conflict_with_the_checkpoint_are_refused(tiny_pretrained, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(tiny_pretrained, [override])


def test_the_recipe_keys_need_a_pretrained_encoder(tiny):
    with pytest.raises(ConfigError, match="train.layer_decay: expected 1 .layer-wise decay needs model.pretrained"):
        load_config(tiny / "tiny.toml", ["train.layer_decay=0.9"])


def test_bad_checkpoint_folders_are_refused_naming_the_file(tiny_pretrained, tmp_path):
    folder = copy_checkpoint(tmp_path)
    override = f"model.pretrained={folder}"
    os.remove(folder / "model.safetensors")
    with pytest.raises(ConfigError, match=f"{folder}: no model.safetensors; expected the encoder's weights"):
        load_config(tiny_pretrained, [override])
    shutil.rmtree(folder)
    folder = copy_checkpoint(tmp_path)
    with open(folder / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("extra\n")
    with pytest.raises(ConfigError, match=r"vocab.txt: 442 pieces, but the embedding table of .*config.json has 441"):
        load_config(tiny_pretrained, [override])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    with pytest.raises(ConfigError, match=r"config.json: model_type 't5' is not supported; supported: bert.*gemma$"):
        load_config(tiny_pretrained, [override])
    with pytest.raises(ConfigError, match="model.pretrained: expected a folder holding a pretrained encoder"):
        load_config(tiny_pretrained, [f"model.pretrained={tmp_path / 'missing'}"])


# === The recipe ===


def test_learning_rate_scales_and_weight_decay_exclusions(tiny_pretrained):
    from amptrain.models.pretrained import decays, find_encoder, learning_rate_scales
    from amptrain.tasks import prepared_in_scratch

    config = load_config(tiny_pretrained)
    task = prepared_in_scratch(config)
    model, _, _ = task.create_model()
    scales = learning_rate_scales(model, config.train)  # lr 3e-3, head 1e-2, decay 0.8
    encoder = find_encoder(model)
    by_layer = {
        "head": [v for v in model.trainable_variables if "logits" in v.path],
        "top": encoder.get_layer("transformer_layer_1").trainable_variables,
        "below": encoder.get_layer("transformer_layer_0").trainable_variables,
        "embeddings": encoder.get_layer("token_embedding").trainable_variables,
    }
    expected = {"head": 1e-2 / 3e-3, "top": 1.0, "below": 0.8, "embeddings": 0.64}
    for name, variables in by_layer.items():
        assert variables and all(scales[id(v)] == pytest.approx(expected[name]) for v in variables), name
    # No 1_Pooling/config.json: BERT's pooled [CLS] state, its pooler at the top layer's rate.
    assert task.checkpoint.pooling == "cls"
    assert all(scales[id(v)] == 1.0 for v in encoder.get_layer("pooled_dense").trainable_variables)
    names = {v.path.split("/")[-1]: decays(v) for v in model.trainable_variables}
    assert names["kernel"] and names["embeddings"] and not names["bias"] and not names["gamma"]


def test_scaled_adamw_scales_the_step_and_the_decay_of_each_variable():
    """Adam's first step moves each weight by the learning rate (m / sqrt(v) = sign of the
    gradient); decoupled decay takes lr x decay x weight off first, except where `decays` says no."""
    import keras
    import tensorflow as tf

    from amptrain.engine.optimizer import ScaledAdamW

    a, b = (
        keras.Variable(np.full(2, 2.0, np.float32), name="kernel"),
        keras.Variable(np.ones(2, np.float32), name="bias"),
    )
    optimizer = ScaledAdamW(
        {id(a): 0.5, id(b): 1.0}, lambda v: "bias" not in v.path, 0.1, learning_rate=0.01, epsilon=0
    )
    optimizer.build([a, b])
    optimizer.apply([tf.constant([1.0, -1.0]), tf.constant([1.0, -1.0])], [a, b])
    lr_a = 0.01 * 0.5
    np.testing.assert_allclose(a.numpy(), [2.0 - lr_a * 0.1 * 2.0 - lr_a, 2.0 - lr_a * 0.1 * 2.0 + lr_a], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [1.0 - 0.01, 1.0 + 0.01], rtol=1e-6)


def test_a_sentence_transformers_checkpoint_pools_by_masked_mean(tiny_pretrained, tmp_path):
    from amptrain.models.pretrained import find_encoder
    from amptrain.tasks import prepared_in_scratch

    folder = copy_checkpoint(tmp_path)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    task = prepared_in_scratch(load_config(tiny_pretrained, [f"model.pretrained={folder}"]))
    model, _, _ = task.create_model()
    assert task.checkpoint.pooling == "mean" and model.get_layer("pooling") is not None
    assert not find_encoder(model).get_layer("pooled_dense").trainable  # unused: it would get no gradient


# === Runs ===


@pytest.mark.slow
def test_fine_tunes_evaluates_predicts_and_refuses_other_weights_on_resume(tiny_pretrained, tmp_path):
    run, folder = str(tmp_path / "run"), copy_checkpoint(tmp_path)
    overrides = ["precision.policy=float32", f"model.pretrained={folder}"]
    result = amptrain.fit(str(tiny_pretrained), ["train.steps=6", *overrides], run_dir=run)
    assert 0.0 <= result["test"]["accuracy"] <= 1.0
    record = json.loads(open(os.path.join(run, "pretrained.json")).read())
    assert record["path"] == str(folder) and len(record["weights_sha256"]) == 64
    with open(os.path.join(run, "vocab.txt"), encoding="utf-8") as f:
        assert f.read() == open(os.path.join(TINY_BERT, "vocab.txt"), encoding="utf-8").read()
    first = [r for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r.get("kind") == "train"][0]
    assert np.isfinite(first["loss"])
    assert amptrain.evaluate(run)["accuracy"] == result["test"]["accuracy"]
    (prediction,) = amptrain.predict(run, ["WIN a FREE cruise, click now"])
    assert prediction["label"] in ("ham", "spam")

    # Continuing the run after the checkpoint's weights changed under the same path is refused.
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="other weights than the run was trained from"):
        amptrain.fit(str(tiny_pretrained), ["train.steps=8", *overrides], run_dir=run)


def test_tokens_end_with_sep_and_a_cut_text_keeps_it(tiny_pretrained):
    from amptrain.data.vocabulary import CLS, SEP
    from amptrain.tasks import prepared_in_scratch

    task = prepared_in_scratch(load_config(tiny_pretrained))
    cls, sep = task.tokenizer.token_id(CLS), task.tokenizer.token_id(SEP)
    for ids in task.splits["train"].encoded["token_ids"]:
        assert ids[0] == cls and ids[-1] == sep and len(ids) <= 32
    assert task.splits["train"].truncated > 0  # 32 pieces cut most spam texts


@pytest.mark.slow
def test_ner_on_a_pretrained_encoder_trains_and_tags(tiny_ner_pretrained, tmp_path):
    run = str(tmp_path / "run")
    result = amptrain.fit(str(tiny_ner_pretrained), ["train.steps=6", "precision.policy=float32"], run_dir=run)
    assert "entity_f1" in result["test"]
    (record,) = amptrain.predict(run, ["Barack Obama flew to Paris on Monday"])
    assert record["tokens"][:2] == ["Barack", "Obama"] and len(record["tags"]) == 7
