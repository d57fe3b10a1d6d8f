"""Pretrained causal language models (GPT-2, Llama 3, Qwen2, Gemma) against `transformers`:
the tiny random checkpoints and the reference of make_causal.py (ids, float32 logits, greedy
continuations of 20 pieces); the folder checks; LoRA's adapters, slots and merge."""

import json
import os
import shutil

import numpy as np
import pytest
from pretrained.test_families import HERE, folder

import amptrain
from amptrain.config import load_config
from amptrain.config.pretrained import read_checkpoint
from amptrain.errors import ConfigError
from amptrain.tasks.language_model.families import family_of
from amptrain.tasks.language_model.lora import adapters, apply_lora, merge_lora
from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

FAMILIES = ["gpt2", "llama3", "qwen2", "gemma"]


def reference(family):
    with open(os.path.join(HERE, f"reference-tiny-{family}.json"), encoding="utf-8") as f:
        return json.load(f)["texts"]


def features(ids, segments=None, positions=None):
    ids = np.array([ids], np.int32)
    segments = np.zeros_like(ids) if segments is None else np.array([segments], np.int32)
    positions = np.arange(ids.shape[1], dtype=np.int32)[None] if positions is None else np.array([positions], np.int32)
    return {"token_ids": ids, "segment_ids": segments, "positions": positions}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_gives_transformers_ids_and_text(family):
    """Accents, digit runs, whitespace runs, tabs and newlines, an emoji; the start piece
    (Llama 3's, Gemma's) where `transformers` puts one."""
    checkpoint = read_checkpoint(folder(family))
    tokenizer = family_of(checkpoint).tokenizer(checkpoint)
    for record in reference(family):
        assert tokenizer.prefix + tokenizer.encode([record["text"]])[0].tolist() == record["ids"]
        assert tokenizer.decode(record["generated_ids"]) == record["generated"]


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_logits_are_transformers_within_1e4(family):
    model = PretrainedLanguageModel(read_checkpoint(folder(family)), 128, 0.0, "float32")
    for record in reference(family):
        logits = model(features(record["ids"])).numpy()[0]
        assert np.abs(logits[:, :32] - np.array(record["logits_first_columns"])).max() < 1e-4
        assert np.abs(logits[-1] - np.array(record["logits_last"])).max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_predict_on_the_folder_continues_as_transformers_generate(family):
    """Greedy, 20 new pieces at most, stopping at the end piece, special pieces skipped.
    The reference's closest call between the two likeliest pieces is wide enough to be exact."""
    records = reference(family)
    assert min(r["smallest_margin"] for r in records) > 1e-3
    got = amptrain.predict(folder(family), [r["text"] for r in records], overrides=["generate.max_new_tokens=20"])
    assert [g["generated"] for g in got] == [r["generated"] for r in records]


def test_a_document_packed_after_another_scores_as_alone():
    """GPT-2's positions restart at each document; RoPE (Llama) is relative: the second
    document's logits are the same packed or alone."""
    for family in ("gpt2", "llama3"):
        model = PretrainedLanguageModel(read_checkpoint(folder(family)), 128, 0.0, "float32")
        first, second = [40, 77, 266], [34, 290, 75, 220, 15]
        packed = model(features(first + second, [0] * 3 + [1] * 5, [0, 1, 2, 0, 1, 2, 3, 4])).numpy()[0, 3:]
        alone = model(features(second)).numpy()[0]
        assert np.abs(packed - alone).max() < 1e-4


def test_folders_the_task_cannot_use_are_refused_in_one_line(tmp_path):
    config = tmp_path / "lm.toml"
    config.write_text(
        f'task = "language_model"\n[data]\ntrain = "{tmp_path}"\n[model]\npretrained = "{folder("gpt2")}"\n'
    )
    bert = os.path.join(HERE, "tiny-bert")
    with pytest.raises(ConfigError, match=r"tiny-bert is a bert \(encoder\) folder; .* causal one: gpt2, llama, qwen2"):
        load_config(str(config), [f"model.pretrained={bert}"], check_files=False)
    with pytest.raises(ConfigError, match=r"tiny-gpt2 is a gpt2 \(causal\) folder; task 'classification'"):
        load_config(str(config), ["task=classification"], check_files=False)
    copy = tmp_path / "t5"
    shutil.copytree(folder("gpt2"), copy)
    settings = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**settings, "model_type": "t5"}))
    with pytest.raises(
        ConfigError, match=r"model_type 't5' is not supported; supported: bert, .*gpt2, llama, qwen2, gemma"
    ):
        read_checkpoint(str(copy))
    for family, setting, refused in (
        ("qwen2", {"use_sliding_window": True}, r"use_sliding_window: expected False \(what keras-hub builds\)"),
        ("llama3", {"attention_bias": True}, r"attention_bias: expected False"),
        ("gemma", {"rope_parameters": {"rope_theta": 500.0}}, r"rope_theta: expected 10000 or 10000.0"),
    ):
        changed = tmp_path / family
        shutil.copytree(folder(family), changed)
        settings = json.loads((changed / "config.json").read_text())
        (changed / "config.json").write_text(json.dumps({**settings, **setting}))
        with pytest.raises(ConfigError, match=f"{family}/config.json: {refused}"):
            read_checkpoint(str(changed))
    with pytest.raises(ConfigError, match=r"train.lora_targets: expected a comma-separated list of query, key"):
        load_config(str(config), ["train.lora_rank=2", "train.lora_targets=query,attention"], check_files=False)
    with pytest.raises(ConfigError, match=r"train.lora_rank: expected 0 \(LoRA adapts model.pretrained"):
        load_config(str(config), ["model.pretrained=", "train.lora_rank=2"], check_files=False)


class Train:
    lora_rank, lora_alpha, lora_targets = 2, 4.0, "query,value,down"


def test_a_projection_the_family_lacks_is_refused_naming_what_it_has():
    model = PretrainedLanguageModel(read_checkpoint(folder("gpt2")), 128, 0.0, "float32")

    class Gated(Train):
        lora_targets = "query,gate"

    with pytest.raises(ConfigError, match=r"lora_targets: expected a comma-separated list of query, key, value, out"):
        apply_lora(model, Gated)


@pytest.mark.parametrize("family", ["llama3", "gemma"])
def test_lora_trains_adapters_only_and_merging_them_changes_no_output(family):
    model = PretrainedLanguageModel(read_checkpoint(folder(family)), 128, 0.0, "float32")
    before = model(features([5, 6, 7, 8])).numpy()
    apply_lora(model, Train)
    assert (
        model.trainable_variables == adapters(model) and len(adapters(model)) == 2 * 3 * 2
    )  # A, B; 3 targets, 2 layers
    assert np.array_equal(model(features([5, 6, 7, 8])).numpy(), before)  # B starts at zero
    for variable in adapters(model):
        variable.assign(np.random.default_rng(0).normal(0, 0.3, variable.shape).astype(np.float32))
    adapted = model(features([5, 6, 7, 8])).numpy()
    assert np.abs(adapted - before).max() > 1e-2
    merge_lora(model)
    assert np.abs(model(features([5, 6, 7, 8])).numpy() - adapted).max() < 1e-5


def test_rank_8_adapters_train_under_5_percent_of_a_gpt2_128_wide(tmp_path):
    """tiny-gpt2 widened 8 times (random weights of the shapes its config then implies):
    adapters of rank 8 on the queries and values are 2.2% of its 464,000 parameters, and
    only they have gradients and Adam's slots (`engine.memory.variable_parts`)."""
    from safetensors.numpy import load_file, save_file

    from amptrain.config import TrainConfig
    from amptrain.engine.memory import variable_parts
    from amptrain.engine.optimizer import build_optimizer

    wide = tmp_path / "wide-gpt2"
    shutil.copytree(folder("gpt2"), wide)
    settings = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**settings, "n_embd": 128}))
    rng = np.random.default_rng(0)
    tensors = load_file(str(wide / "model.safetensors"))
    shapes = {name: [d * 8 if d in (16, 48, 64) else d for d in t.shape] for name, t in tensors.items()}
    save_file(
        {name: rng.normal(0, 0.02, s).astype(np.float32) for name, s in shapes.items()}, str(wide / "model.safetensors")
    )
    model = PretrainedLanguageModel(read_checkpoint(str(wide)), 128, 0.0, "float32")

    class Rank8:
        lora_rank, lora_alpha, lora_targets = 8, 0.0, "query,value"

    apply_lora(model, Rank8)
    optimizer, _ = build_optimizer(TrainConfig(), total_steps=10)
    optimizer.build(model.trainable_variables)
    parts = variable_parts(model, optimizer)
    assert parts["trainable_parameters"] == 2 * 2 * (128 * 2 * 8 + 8 * 64) == 10_240
    assert parts["trainable_parameters"] / parts["parameters"] < 0.05
    assert parts["slots"] == 2 * 4 * 10_240 + 8 and parts["gradients"] == 4 * 10_240


@pytest.mark.parametrize("family", ["llama3", "qwen2", "gemma"])
def test_a_position_at_a_time_over_the_cache_is_the_whole_forward_pass(family):
    """Generation's step (Llama's and Qwen2's lean, `families/decoding.py`, after a prefill of
    the first three positions; Gemma's through keras-hub) with adapters on every projection:
    each position's logits are the full pass's (float32, 1e-4); under mixed_bfloat16 they stay
    within the precision's reach of them."""
    import tensorflow as tf

    ids = [5, 17, 3, 40, 9, 22, 11]
    full = None
    for dtype, tolerance in (("float32", 1e-4), ("mixed_bfloat16", 0.1)):
        model = PretrainedLanguageModel(read_checkpoint(folder(family)), 16, 0.0, dtype)

        class Every(Train):
            lora_targets = "query,key,value,output,gate,up,down"

        apply_lora(model, Every)
        for variable in adapters(model):
            variable.assign(np.random.default_rng(1).normal(0, 0.3, variable.shape).astype(np.float32))
        full = model(features(ids)).numpy()[0] if full is None else full
        caches, weights = model.empty_caches(2, 16), model.decoding_weights()
        ahead = 3 if weights is not None else 0  # lean: the first positions written at once
        if weights is not None:
            caches = model.prefill(tf.zeros((2, 0), tf.int32), caches, weights)  # none: the caches as they were
            caches = model.prefill(tf.constant([ids[:ahead]] * 2, tf.int32), caches, weights)
        for index, piece in enumerate(ids[ahead:], ahead):
            logits, caches = model.step(tf.constant([piece, piece], tf.int32), index, caches, weights)
            assert np.abs(logits.numpy() - full[index][None]).max() < tolerance * max(1.0, np.abs(full).max())
