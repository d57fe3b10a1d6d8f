"""`amptrain.Trainer` on a tiny model of the user's own: the numbers it reports checked
against the model's own outputs, and each bad input refused in one line before training."""

import json

import keras
import numpy as np
import pytest

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.errors import UserError

FAST = {
    "precision.policy": "float32",
    "runtime.jit_compile": False,
    "train.steps": 6,
    "train.log_every": 3,
    "train.checkpoint_every": 3,
    "train.eval_every": 3,
    "train.warmup_steps": 0,
}


def data(rows=124, seed=0):
    """Token ids (0 pads the last third of each row) and whether id 7 appears."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 30, size=(rows, 9)).astype("int32")
    ids[:, 6:] = 0
    return {"token_ids": ids}, (ids == 7).any(axis=1).astype("int32")


def build(policy):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    states = keras.layers.Embedding(30, 16, mask_zero=True)(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(states)
    return keras.Model({"token_ids": ids}, keras.layers.Dense(2, dtype="float32", name="logits")(pooled))


def splits():
    x, y = data()
    part = lambda a, b: ({"token_ids": x["token_ids"][a:b]}, y[a:b])  # noqa: E731
    return {"train": part(0, 64), "dev": part(64, 84), "test": part(84, 124)}


def make(tmp_path, **changes):
    arguments = dict(
        model=build,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        config=FAST,
        run_dir=str(tmp_path / "run"),
        batch_size=16,
        **splits(),
    )
    arguments.update(changes)
    return amptrain.Trainer(**arguments)


def test_fit_evaluate_and_predict_agree_with_the_models_own_outputs(tmp_path):
    trainer = make(tmp_path)
    test = trainer.fit()
    assert test == pytest.approx(trainer.evaluate("test"))
    features, labels = splits()["test"]  # 40 rows: batches of 16, 16 and 8 (filled to 16 at weight 0)
    logits = trainer.predict(features)
    assert logits.shape == (40, 2)
    assert test["examples"] == 40
    assert test["accuracy"] == pytest.approx(np.mean(logits.argmax(axis=1) == labels))
    shifted = logits - logits.max(axis=1, keepdims=True)
    cross_entropy = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(40), labels]
    assert test["loss"] == pytest.approx(cross_entropy.mean(), rel=1e-5)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    run = next(r for r in records if r["kind"] == "run")
    assert run["policy"] == "float32"
    assert [r["step"] for r in records if r["kind"] == "train"] == [3, 6]
    assert (tmp_path / "run" / "data.json").exists()


@pytest.mark.slow  # a second fit: out of the quick tier's budget
def test_auto_takes_the_hardware_rule_and_says_so(tmp_path, caplog):
    trainer = make(tmp_path, config={**FAST, "precision.policy": "auto", "train.steps": 1})
    with caplog.at_level("INFO", logger="amptrain"):
        trainer.fit()
    assert "auto on your own model: the hardware rule" in caplog.text
    run = next(r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "run")
    assert run["policy"] in ("float32", "mixed_bfloat16")


def no_model(policy):
    return "not a model"


def frozen(policy):
    model = build(policy)
    model.trainable = False
    return model


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": no_model}, r"model: the builder returned str, not a keras.Model"),
        ({"model": frozen}, r"model: 'functional.*' has no trainable weights"),
        ({"metrics": ["accuracy", "no_such_metric"]}, r"metrics: Keras knows no metric 'no_such_metric'"),
        ({"monitor": "f1"}, r"monitor: 'f1' is never computed; expected one of \['loss', 'accuracy'\]"),
        ({"config": {"data.train": "x.csv"}}, r"config: 'data.train' is not for your own model"),
        ({"config": {"train.epochs": "three"}}, r"train\.epochs: expected int, received 'three'"),
        ({"loss": lambda y, out: (out, 1.0)}, r"loss: expected per-target values that sum to a scalar"),
        ({"train": ({"ids": np.zeros((8, 9), "int32")}, np.zeros(8, "int32"))}, r"data: the batches' features"),
    ],
)
def test_bad_input_is_one_line_before_any_training(tmp_path, changes, message):
    with pytest.raises(UserError, match=message) as caught:
        make(tmp_path, **changes).fit()
    assert "\n" not in str(caught.value)
    assert not list((tmp_path / "run").glob("checkpoints/ckpt-*"))


def test_a_built_model_under_another_policy_is_refused_naming_a_layer(tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = build("mixed_bfloat16")
    finally:
        keras.config.set_dtype_policy("float32")
    with pytest.raises(UserError, match=r"model: layer 'embedding.*' computes under 'mixed_bfloat16'"):
        make(tmp_path, model=model).fit()


def test_the_run_folder_of_your_own_model_is_read_back_from_python(tmp_path):
    make(tmp_path, config={**FAST, "train.steps": 1}).fit()
    with pytest.raises(UserError, match=r"a run of your own Keras model is read back from Python"):
        amptrain.evaluate(str(tmp_path / "run"))
    saved = (tmp_path / "run" / "config.toml").read_text()
    assert 'task = "keras_model"' in saved and json.loads((tmp_path / "run" / "data.json").read_text())["rows"] == 16
