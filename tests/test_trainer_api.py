"""`amptrain.Trainer` on a tiny model of the user's own: the numbers it reports checked
against the model's own outputs, and each bad input refused in one line before training."""

import json
import os

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
    states = keras.layers.Embedding(30, 16, mask_zero=True, name="tokens")(ids)
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
    history = trainer.fit()
    test = history.test
    assert test == pytest.approx(trainer.evaluate("test"))
    # as model.fit's: a value an epoch (here an evaluation interval of 3 steps)
    assert sorted(history.history) == ["loss", "val_accuracy", "val_loss"] and history.epoch == [0, 1]
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


def test_the_probe_times_the_first_training_batch_and_names_the_builder(tmp_path):
    """What `auto` measures on your model: the first training batch (16 rows of 9 token
    ids), repeated; and what names your model in the probe's cache (the config does not)."""
    trainer = make(tmp_path)
    task = trainer._task(trainer.config, str(tmp_path / "run"))
    task.prepare()
    dataset, shape = task.probe_batches()
    assert shape == (16, 9)
    first, again = list(dataset.take(2).as_numpy_iterator())
    training = next(task.train_dataset(0).as_numpy_iterator())  # the run's first batch (shuffled, seeded)
    for batch in (first, again):
        np.testing.assert_array_equal(batch[0]["token_ids"], training[0]["token_ids"])
    assert first[2][:, 0].sum() == (training[0]["token_ids"] != 0).sum() == 16 * 6  # real tokens: non-zero ids
    identity = task.probe_identity()
    assert identity["builder"].startswith("test_trainer_api.build ") and "token_ids" in identity["batches"]
    other = make(tmp_path, model=frozen)._task(trainer.config, str(tmp_path / "other"))
    other.prepare()
    assert other.probe_identity()["builder"].split()[0] == "test_trainer_api.frozen"


@pytest.mark.slow  # the candidates compiled and timed, then the fit: out of the quick tier's budget
def test_auto_measures_your_model_and_records_the_candidates(tmp_path, monkeypatch):
    """`runtime.jit_compile = "auto"` on your model: each candidate built from your builder
    and timed on your first training batch, the choice and its candidates in
    precision.json and the run record, the winner trained (not built again), and the same
    model with another builder is not answered from the first one's cache entry."""
    from amptrain.autoprecision import measurement, probe
    from amptrain.engine import loop

    monkeypatch.setattr(measurement.Budget, "verdict", lambda self, candidate, speeds: None)  # build them all
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    built_by_the_loop = []
    build_training = loop.build_training
    monkeypatch.setattr(loop, "build_training", lambda *a, **k: built_by_the_loop.append(1) or build_training(*a, **k))
    trainer = make(tmp_path, config={**FAST, "runtime.jit_compile": "auto"})
    trainer.fit()
    record = json.loads((tmp_path / "run" / "precision.json").read_text())
    found = {c["label"]: c["tokens_per_second"] for c in record["candidates"]}
    assert {"float32", "float32+XLA"} <= set(found) and all(v > 0 for v in found.values())
    assert record["source"] == "measured" and record["probe_seconds"] > 0
    assert record["expected_saving_seconds"] is not None
    run = next(r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "run")
    assert (run["policy"], run["jit_compile"]) == (record["policy"], record["jit_compile"])
    assert run["precision_choice"]["candidates"] == record["candidates"]
    assert built_by_the_loop == []  # the run took the probe's winner
    assert probe.Decision.from_json(record).candidate.label() in found
    # the cache is per builder: another model of the same batches is measured, not looked up
    wider = make(tmp_path, model=wide, config={**FAST, "runtime.jit_compile": "auto"}, run_dir=str(tmp_path / "wide"))
    wider.fit()
    assert json.loads((tmp_path / "wide" / "precision.json").read_text())["source"] == "measured"
    assert len(os.listdir(tmp_path / "cache" / "probe")) == 2


def wide(policy):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    states = keras.layers.Embedding(30, 32, mask_zero=True)(ids)
    states = keras.layers.Dense(32, activation="relu")(states)
    pooled = keras.layers.GlobalAveragePooling1D()(states)
    return keras.Model({"token_ids": ids}, keras.layers.Dense(2, dtype="float32", name="logits")(pooled))


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
        (
            {"train": ({"token_ids": np.full((8, 9), 45, "int64")}, np.zeros(8, "int32"))},
            r"data: the first training batch holds id 45 at \[0,0\], past the end of Embedding's 30 rows: "
            r"expected ids 0 to 29",
        ),
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
    with pytest.raises(UserError, match=r"model: layer 'tokens' computes under 'mixed_bfloat16'"):
        make(tmp_path, model=model).fit()


def test_the_run_folder_of_your_own_model_is_read_back_from_python(tmp_path):
    make(tmp_path, config={**FAST, "train.steps": 1}, projector_layer="tokens").fit()
    # the named embedding, for TensorBoard's projector: its 30 rows, each named by its id
    projected = (tmp_path / "run" / "tensorboard" / "train" / "projector-tokens.tsv").read_text().splitlines()
    assert projected == [str(i) for i in range(30)]
    with pytest.raises(UserError, match=r"a run of your own Keras model is read back from Python"):
        amptrain.evaluate(str(tmp_path / "run"))
    saved = (tmp_path / "run" / "config.toml").read_text()
    assert 'task = "keras_model"' in saved and json.loads((tmp_path / "run" / "data.json").read_text())["rows"] == 16


def test_a_resume_with_another_model_says_the_model_changed(tmp_path):
    make(tmp_path).fit()
    records = tmp_path / "run" / "metrics.jsonl"  # as a run stopped before its end: to be resumed
    lines = records.read_text().splitlines(keepends=True)
    records.write_text("".join(line for line in lines if '"kind": "end"' not in line))
    changed = r"does not fit the model .*: the model changed since the run saved it"
    with pytest.raises(UserError, match=changed) as caught:
        make(tmp_path, model=wide).fit()
    assert "\n" not in str(caught.value)
