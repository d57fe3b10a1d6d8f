"""`engine.build`: fit and the bench build their training parts with one function, so the
bench times the step training runs (weight average, accumulation, stop conditions)."""

import pytest

from amptrain import config as config_lib
from amptrain.bench.building import build_trainer
from amptrain.engine.build import build_training
from amptrain.tasks import prepared_in_scratch

SETTINGS = [
    "train.ema_decay=0.9",
    "train.accumulation_steps=2",
    "train.clip_norm=0.5",
    "train.on_nonfinite=skip",
    "precision.policy=mixed_float16",
    "precision.max_consecutive_skips=7",
]


@pytest.fixture
def config(tiny):
    return config_lib.load_config(str(tiny / "tiny.toml"), SETTINGS)


def test_the_bench_builds_the_step_fit_trains(config):
    task, model, trainer, policy = build_trainer(config)
    assert policy == "mixed_float16" and trainer.model is model
    assert trainer.weight_average is not None and trainer.weight_average.decay == pytest.approx(0.9)
    assert trainer.accumulation_steps == 2 and trainer.clip_norm == 0.5
    assert trainer.max_consecutive_skips == 7 and trainer.stop_on_nonfinite_loss is False
    assert trainer.loss_scale is not None  # dynamic under float16 (precision.loss_scale = "auto")


def test_the_checkpoint_state_holds_every_part(config):
    import tensorflow as tf

    task = prepared_in_scratch(config)
    model, policy, _ = task.create_model()
    parts = build_training(model, task.loss, config, tf.distribute.get_strategy(), policy, total_steps=10)
    state = parts.checkpoint_state()
    assert set(state) == {
        "loss_scale",
        "learning_rate_factor",
        "step",
        "skipped_steps",
        "consecutive_skips",
        "weight_average",
    }
    assert state["loss_scale"] is parts.loss_scale and state["step"] is parts.trainer.step
