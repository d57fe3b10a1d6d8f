import os

import pytest

from amptrain import config as config_lib
from amptrain.errors import ConfigError


def load(tiny, *overrides):
    return config_lib.load_config(tiny / "tiny.toml", list(overrides))


def test_overrides_are_toml_values_or_bare_strings(tiny):
    config = load(tiny, "precision.initial_scale=1e10", "train.batch_size=64", "precision.policy=mixed_bfloat16")
    assert config.precision.initial_scale == 1e10
    assert config.train.batch_size == 64
    assert config.precision.policy == "mixed_bfloat16"


def test_relative_paths_resolve_against_the_working_directory(tiny, monkeypatch):
    monkeypatch.chdir(tiny)
    config = load(tiny, "data.train=train.csv")
    assert config.data.train == os.path.join(str(tiny), "train.csv")


def test_unknown_key_names_the_key_and_the_known_ones(tiny):
    with pytest.raises(ConfigError, match=r"unknown key train\.batchsize; \[train\] has: steps, epochs, batch_size"):
        load(tiny, "train.batchsize=3")


def test_wrong_type_says_expected_and_received(tiny):
    with pytest.raises(ConfigError, match=r"train\.batch_size: expected int, received 'abc' \(str\)"):
        load(tiny, "train.batch_size=abc")
    with pytest.raises(ConfigError, match=r"runtime\.jit_compile: expected bool or str, received 1"):
        load(tiny, "runtime.jit_compile=1")


def test_impossible_values_are_refused(tiny):
    with pytest.raises(
        ConfigError, match=r"model\.num_heads: expected a divisor of model\.hidden_dim \(16\), received 3"
    ):
        load(tiny, "model.num_heads=3")
    with pytest.raises(ConfigError, match=r"precision\.policy: expected one of"):
        load(tiny, "precision.policy=fp8")
    with pytest.raises(ConfigError, match=r"data\.dev: expected an existing file"):
        load(tiny, "data.dev=missing.csv")


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "precision.loss_scale=0",
            r"precision\.loss_scale: expected a finite number > 0 \(a fixed scale\), received 0\.0",
        ),
        (
            "precision.loss_scale=-8",
            r"precision\.loss_scale: expected a finite number > 0 \(a fixed scale\), received -8\.0",
        ),
        (
            "precision.loss_scale=inf",
            r"precision\.loss_scale: expected a finite number > 0 \(a fixed scale\), received inf",
        ),
        (
            "precision.loss_scale=nan",
            r"precision\.loss_scale: expected a finite number > 0 \(a fixed scale\), received nan",
        ),
        (
            "precision.loss_scale=static",
            r"precision\.loss_scale: expected auto \| dynamic \| none or a number > 0, received 'static'",
        ),
        ("precision.initial_scale=0", r"precision\.initial_scale: expected a finite number > 0, received 0\.0"),
        ("precision.initial_scale=nan", r"precision\.initial_scale: expected a finite number > 0, received nan"),
        ("precision.backoff_factor=1", r"precision\.backoff_factor: expected a number in \(0, 1\), received 1\.0"),
        ("precision.backoff_factor=0", r"precision\.backoff_factor: expected a number in \(0, 1\), received 0\.0"),
        ("precision.growth_factor=1", r"precision\.growth_factor: expected a finite number > 1, received 1\.0"),
        ("precision.growth_factor=inf", r"precision\.growth_factor: expected a finite number > 1, received inf"),
        ("precision.growth_interval=0", r"precision\.growth_interval: expected an integer >= 1, received 0"),
        ("precision.hysteresis=0", r"precision\.hysteresis: expected an integer >= 1, received 0"),
        ("precision.min_scale=0", r"precision\.min_scale: expected a finite number > 0, received 0\.0"),
        (
            "precision.max_scale=0.5",
            r"precision\.min_scale: expected at most precision\.max_scale \(0\.5\), received 1\.0",
        ),
        (
            "precision.max_consecutive_skips=0",
            r"precision\.max_consecutive_skips: expected an integer >= 1, received 0",
        ),
        ("train.on_nonfinite=ignore", r"train\.on_nonfinite: expected stop \| skip \| restore, received 'ignore'"),
        ("train.restore_lr_factor=0", r"train\.restore_lr_factor: expected a number in \(0, 1\], received 0\.0"),
        ("train.max_restores=0", r"train\.max_restores: expected an integer >= 1, received 0"),
    ],
)
def test_impossible_loss_scaler_and_nan_policy_values_are_refused(tiny, setting, message):
    with pytest.raises(ConfigError, match=message):
        load(tiny, setting)


def test_loss_scale_is_a_mode_or_a_number(tiny):
    assert load(tiny).precision.loss_scale == "auto"
    assert load(tiny, "precision.loss_scale=dynamic").precision.loss_scale == "dynamic"
    assert load(tiny, "precision.loss_scale=1024").precision.loss_scale == 1024.0
    # An initial or fixed scale may lie above max_scale: only growth is bounded by it.
    assert load(tiny, "precision.initial_scale=1e10").precision.initial_scale == 1e10
    with pytest.raises(ConfigError, match=r"precision\.loss_scale: expected str or float, received True \(bool\)"):
        load(tiny, "precision.loss_scale=true")


def test_steps_win_over_epochs(tiny):
    assert load(tiny, "train.steps=7", "train.epochs=5").train.total_steps(steps_per_epoch=100) == 7
    assert load(tiny, "train.epochs=5").train.total_steps(steps_per_epoch=100) == 12  # tiny.toml sets steps
    config = config_lib.config_from_dict({"data": {"train": str(tiny / "train.csv")}, "train": {"epochs": 5}})
    assert config.train.total_steps(steps_per_epoch=100) == 500


def test_saved_config_round_trips_and_differences_ignore_run_length(tiny):
    config = load(tiny)
    config_lib.save_config(config, tiny / "saved.toml")
    saved = config_lib.load_config(tiny / "saved.toml")
    assert saved == config
    assert config_lib.differing_keys(saved, load(tiny, "train.steps=99")) == []
    assert config_lib.differing_keys(saved, load(tiny, "model.hidden_dim=32")) == ["model.hidden_dim"]


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "data.tokens_per_batch=16",
            r"data\.tokens_per_batch: expected 0 or at least data\.max_length rounded up to a "
            r"multiple of 8 \(32\), so the longest batch holds a row, received 16",
        ),
        ("data.tokens_per_batch=-1", r"data\.tokens_per_batch: expected an integer >= 0"),
        (
            "task=translation decode.beam_size=0",
            r"decode\.beam_size: expected an integer >= 1 \(1: greedy\), received 0",
        ),
        (
            "task=translation train.label_smoothing=1",
            r"train\.label_smoothing: expected a number in \[0, 1\), received 1\.0",
        ),
        ("task=translation model.num_decoder_layers=-1", r"model\.num_decoder_layers: expected an integer >= 0"),
        (
            "data.keep_tail=30",
            r"data\.keep_tail: expected an integer from 0 to data\.max_length - 3 \(29\), leaving room for "
            r"\[CLS\], \[SEP\] and one piece of the text's start, received 30",
        ),
        ("data.keep_tail=-1", r"data\.keep_tail: expected an integer from 0 to"),
    ],
)
def test_impossible_batching_decoding_and_translation_values_are_refused(tiny, setting, message):
    with pytest.raises(ConfigError, match=message):
        load(tiny, *setting.split())


def test_a_section_of_another_task_is_refused(tiny):
    """[decode] is translation's own section (TranslationTask.config_sections)."""
    with pytest.raises(ConfigError, match=r"unknown section or key 'decode'; expected one of: task, \[data\]"):
        load(tiny, "decode.beam_size=8")


def test_an_older_runs_default_decode_section_still_loads(tiny):
    """Run folders saved every task's sections; a classification run's [decode] at its defaults is read past."""
    text = (tiny / "tiny.toml").read_text() + "\n[decode]\nbeam_size = 4\nlength_penalty = 0.6\n"
    (tiny / "older.toml").write_text(text)
    assert config_lib.load_config(tiny / "older.toml").task_sections == {}


def test_an_older_runs_keys_of_other_tasks_at_their_defaults_still_load(tiny):
    """Run folders saved every task's keys: a classification run's `data.train_target = ""`,
    `model.num_decoder_layers = 0`, `train.outside_weight = 1.0` and `train.lora_rank = 0` are
    read past; the same keys with another value are refused, naming their task."""
    older = {"data.train_target": '""', "data.shared_vocabulary": "true", "model.num_decoder_layers": "0",
             "model.tie_embeddings": "true", "train.outside_weight": "1.0", "train.label_smoothing": "0.0",
             "train.lora_rank": "0", "train.lora_targets": '"query,value"'}  # fmt: skip
    config = load(tiny, *(f"{key}={value}" for key, value in older.items()))
    assert not hasattr(config.data, "train_target") and not hasattr(config.train, "lora_rank")
    with pytest.raises(ConfigError, match=r"unknown key train\.outside_weight \(a key of task 'ner', not of"):
        load(tiny, "train.outside_weight=2.0")


def test_a_tasks_own_keys_are_saved_and_read_back(tiny, tmp_path):
    config = load(tiny, "task=translation", "train.label_smoothing=0.1", "model.num_decoder_layers=1")
    assert (config.train.label_smoothing, config.model.num_decoder_layers, config.data.shared_vocabulary) == (
        0.1,
        1,
        True,
    )
    config_lib.save_config(config, tmp_path / "config.toml")
    again = config_lib.load_config(tmp_path / "config.toml")
    assert again == config and config_lib.differing_keys(again, config) == []


def test_an_unknown_task_names_the_known_ones(tiny):
    with pytest.raises(
        ConfigError,
        match=r"task: expected one of classification, ner, translation, language_model, keras_model or a task class",
    ):
        load(tiny, "task=sentiment")


def test_a_task_class_by_import_path_that_is_not_a_task_is_refused(tiny):
    (tiny / "notatask.py").write_text("class Pairs:\n    pass\n")
    with pytest.raises(ConfigError, match=r"task: 'notatask:Pairs' is .*, not a subclass of amptrain.Task"):
        load(tiny, "task=notatask:Pairs")
    with pytest.raises(ConfigError, match=r"task: cannot import module 'nosuchmodule'"):
        load(tiny, "task=nosuchmodule:Pairs")


def test_target_files_are_for_translation_only(tiny):
    """A key a task owns (`Task.config_sections`) is unknown to the others, and the error says whose it is."""
    with pytest.raises(
        ConfigError,
        match=r"unknown key data\.train_target \(a key of task 'translation', not of 'classification'\); \[data\] has",
    ):
        load(tiny, f"data.train_target={tiny / 'train.csv'}")


def test_keeping_a_texts_end_is_for_classification_only(tiny_ner):
    with pytest.raises(
        ConfigError, match=r"unknown key data\.keep_tail \(a key of task 'classification', not of 'ner'\)"
    ):
        config_lib.load_config(tiny_ner / "tiny.toml", ["data.keep_tail=4"])


def test_two_file_translation_needs_both_sides_of_each_split(tiny):
    with pytest.raises(ConfigError, match=r"data\.dev_target: expected the target side of data\.dev"):
        load(tiny, "task=translation", "data.format=parallel", "data.train_target=" + str(tiny / "train.csv"))


def test_decode_settings_do_not_stop_a_resume(tiny):
    a, b = (
        load(tiny, "task=translation"),
        load(tiny, "task=translation", "decode.beam_size=8", "decode.dev_sentences=50"),
    )
    assert config_lib.differing_keys(a, b) == []


@pytest.mark.parametrize("value", ["[0, 3]", "[5]", "[9, 5]", "[2.5, 3]", "[true, 3]"])
def test_profile_steps_is_off_or_a_range(tiny, value):
    with pytest.raises(ConfigError, match=r"runtime\.profile_steps: expected \[\] \(off\) or \[first, last\]"):
        load(tiny, f"runtime.profile_steps={value}")


def test_profiling_does_not_stop_a_resume(tiny):
    assert load(tiny, "runtime.profile_steps=[2, 4]").runtime.profile_steps == [2, 4]
    assert config_lib.differing_keys(load(tiny), load(tiny, "runtime.profile_steps=[2, 4]")) == []


def test_histogram_every_is_off_or_a_positive_interval(tiny):
    with pytest.raises(ConfigError, match=r"train\.histogram_every: expected an integer >= 0 \(0: no histograms\)"):
        load(tiny, "train.histogram_every=-1")
    assert config_lib.differing_keys(load(tiny), load(tiny, "train.histogram_every=5")) == []
