"""A tiny classifier trained for a few steps under each policy and execution mode."""

import json

import pytest

import amptrain
from amptrain.engine.run_log import read_metrics


def fit(tiny, name, *overrides):
    return amptrain.fit(str(tiny / "tiny.toml"), list(overrides), run_dir=str(tiny / name))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("steps_per_execution", [1, 4])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_loss_falls_under_every_policy_and_execution_mode(tiny, policy, steps_per_execution, jit_compile):
    result = fit(
        tiny,
        "run",
        f"precision.policy={policy}",
        f"runtime.steps_per_execution={steps_per_execution}",
        f"runtime.jit_compile={str(jit_compile).lower()}",
        "model.dropout=0.0",
    )
    records = read_metrics(tiny / "run" / "metrics.jsonl")
    run = records[0]
    assert (run["kind"], run["policy"], run["steps_per_execution"], run["jit_compile"]) == (
        "run",
        policy,
        steps_per_execution,
        jit_compile,
    )
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert train[-1]["loss"] < train[0]["loss"]
    if policy == "mixed_float16":
        assert all(isinstance(r["loss_scale"], float) and r["loss_scale"] >= 1 for r in train)
    else:
        assert all(r["loss_scale"] is None for r in train)
    assert all(r["tokens_per_second"] > 0 for r in train)
    assert result["test"]["examples"] == 32


def test_run_folder_records_and_predictions_agree(tiny):
    result = fit(tiny, "run", "train.eval_every=6")
    run_dir = tiny / "run"
    records = read_metrics(run_dir / "metrics.jsonl")
    evals = [(r["split"], r["step"], r["checkpoint"]) for r in records if r["kind"] == "eval"]
    best = max((r for r in records if r["kind"] == "eval" and r["split"] == "dev"), key=lambda r: r["accuracy"])
    # dev at 6 and 12; the test split is scored with the best dev checkpoint
    assert evals[:2] == [("dev", 6, "latest"), ("dev", 12, "latest")]
    assert evals[2] == ("test", best["step"], f"ckpt-{best['step']}")
    with open(run_dir / "predictions-test.jsonl", encoding="utf-8") as f:
        predictions = [json.loads(line) for line in f]
    assert len(predictions) == 32
    accuracy = sum(p["label"] == p["predicted"] for p in predictions) / len(predictions)
    assert accuracy == pytest.approx(result["test"]["accuracy"])
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-4 for p in predictions)
    for name in ("config.toml", "vocab.txt", "labels.json", "train.log"):
        assert (run_dir / name).exists()
    assert list((run_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))


@pytest.mark.slow  # trains past a few steps: out of the 5-minute quick tier
def test_a_finished_run_does_nothing_and_a_changed_config_is_refused(tiny):
    fit(tiny, "run")
    before = (tiny / "run" / "metrics.jsonl").read_text()
    fit(tiny, "run")
    assert (tiny / "run" / "metrics.jsonl").read_text() == before
    with pytest.raises(amptrain.errors.ConfigError, match=r"different config \(model\.hidden_dim\)"):
        fit(tiny, "run", "model.hidden_dim=32")
    # More steps for a finished run: refused, saying why (never silently ignored).
    with pytest.raises(amptrain.errors.ConfigError, match=r"finished its 12 steps .* not continued to 20"):
        fit(tiny, "run", "train.steps=20")
    assert (tiny / "run" / "metrics.jsonl").read_text() == before


def test_predict_and_eval_use_the_best_checkpoint(tiny):
    fit(tiny, "run")
    # The final test wrote the best checkpoint's predictions of its texts: predict gives them again.
    with open(tiny / "run" / "predictions-test.jsonl", encoding="utf-8") as f:
        scored_by_test = [json.loads(line) for line in f][:6]
    texts = [r["text"] for r in scored_by_test]
    records = amptrain.predict(str(tiny / "run"), texts)
    assert [r["text"] for r in records] == texts
    assert [r["label"] for r in records] == [r["predicted"] for r in scored_by_test]
    for record, expected in zip(records, scored_by_test):
        assert record["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-5)
    scored = amptrain.evaluate(str(tiny / "run"), split="test")
    test = [r for r in read_metrics(tiny / "run" / "metrics.jsonl") if r.get("split") == "test"][-1]
    assert scored["accuracy"] == pytest.approx(test["accuracy"])


def test_eval_of_a_split_the_run_has_not_is_a_user_error(tiny):
    fit(tiny, "run", 'data.dev=""')
    with pytest.raises(amptrain.errors.UserError, match=r"the run's config has no data\.dev file; pass --data PATH"):
        amptrain.evaluate(str(tiny / "run"), split="dev")
