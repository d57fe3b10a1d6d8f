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
    with pytest.raises(ConfigError, match=r"runtime\.jit_compile: expected bool, received 1"):
        load(tiny, "runtime.jit_compile=1")


def test_impossible_values_are_refused(tiny):
    with pytest.raises(ConfigError, match=r"model\.num_heads: expected a divisor of model\.hidden_dim \(16\), received 3"):
        load(tiny, "model.num_heads=3")
    with pytest.raises(ConfigError, match=r"precision\.policy: expected one of"):
        load(tiny, "precision.policy=fp8")
    with pytest.raises(ConfigError, match=r"data\.dev: expected an existing file"):
        load(tiny, "data.dev=missing.csv")


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
