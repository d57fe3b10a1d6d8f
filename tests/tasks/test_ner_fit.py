"""End to end: a tiny tagger trained under mixed_bfloat16, scored, and used to predict."""

import json

import forked_cli  # tests/: `amptrain` forked after the import
import pytest
from conftest import assert_only_amptrains

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.tasks.ner.spans import score, spans


@pytest.fixture(scope="module")
def run(tiny_ner):
    # With a weight average, as configs/ner-wnut17.toml: the scores and predictions below come
    # from the averaged weights the best checkpoint holds.
    overrides = [
        "precision.policy=mixed_bfloat16",
        "runtime.steps_per_execution=2",
        "train.eval_every=4",
        "train.ema_decay=0.9",
    ]
    amptrain.fit(str(tiny_ner / "tiny.toml"), overrides, run_dir=str(tiny_ner / "bf16"))
    return tiny_ner / "bf16"


def read_predictions(path):
    """(words, gold, predicted) of each sentence of a predictions file."""
    sentences = [[]]
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line:
            sentences[-1].append(line.split("\t"))
        elif sentences[-1]:
            sentences.append([])
    return [[list(column) for column in zip(*s)] for s in sentences if s]


def test_the_final_test_record_agrees_with_the_predictions_file(run, tiny_ner):
    records = read_metrics(run / "metrics.jsonl")
    assert records[0]["policy"] == "mixed_bfloat16" and records[0]["ema_decay"] == 0.9
    assert_only_amptrains(run)
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8, 12]
    assert all(r["tokens_per_second"] > 0 for r in records if r["kind"] == "train")
    test = [r for r in records if r["kind"] == "eval" and r["split"] == "test"][-1]
    best = max((r for r in records if r["kind"] == "eval" and r["split"] == "dev"), key=lambda r: r["entity_f1"])
    assert test["checkpoint"] == f"ckpt-{best['step']}"
    for key in ("entity_f1", "precision", "recall", "token_accuracy", "per_type", "truncated_words"):
        assert key in test
    predictions = read_predictions(run / "predictions-test.conll")
    # every word of the test file (dev.conll here), in order, with its gold tag
    gold_lines = [line for line in (tiny_ner / "dev.conll").read_text(encoding="utf-8").split("\n") if line]
    assert [f"{w}\t{g}" for words, gold, _ in predictions for w, g in zip(words, gold)] == gold_lines
    recomputed = score([gold for _, gold, _ in predictions], [predicted for _, _, predicted in predictions])
    for key in ("entity_f1", "precision", "recall", "token_accuracy"):
        assert recomputed[key] == pytest.approx(test[key])
    assert recomputed["per_type"].keys() == test["per_type"].keys()
    for kind, counts in recomputed["per_type"].items():
        assert counts == pytest.approx(test["per_type"][kind])


def test_eval_scores_like_the_run_and_predict_gives_tokens_tags_and_spans(run):
    records = read_metrics(run / "metrics.jsonl")
    test = [r for r in records if r.get("split") == "test"][-1]
    assert amptrain.evaluate(str(run), split="test")["entity_f1"] == pytest.approx(test["entity_f1"])
    texts = ["Empire State Building = ESB. Pretty bad storm here last evening.", "", "@paulwalk it's #NYC"]
    records = amptrain.predict(str(run), texts)
    assert [r["text"] for r in records] == texts
    assert records[0]["tokens"][:6] == ["Empire", "State", "Building", "=", "ESB", "."]
    assert records[1] == {"text": "", "tokens": [], "tags": [], "entities": []}
    assert records[2]["tokens"] == ["@paulwalk", "it's", "#NYC"]
    for record in records:
        assert len(record["tags"]) == len(record["tokens"])
        assert [e["type"] for e in record["entities"]] == [kind for kind, _, _ in spans(record["tags"])]
        for entity in record["entities"]:
            assert record["text"][entity["start"] : entity["end"]] == entity["text"]


@pytest.mark.slow
def test_cli_predict_prints_one_json_line_a_text(run):
    result = forked_cli.run(["predict", str(run), "--text", "Empire State Building", "--text", "hi"], timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().split("\n")]
    assert [(r["text"], r["tokens"]) for r in lines] == [
        ("Empire State Building", ["Empire", "State", "Building"]),
        ("hi", ["hi"]),
    ]
    assert all(tag == "O" or tag[:2] in ("B-", "I-") for r in lines for tag in r["tags"])


def test_audit_finds_the_float32_tag_head_declared(tiny_ner):
    report = amptrain.audit(str(tiny_ner / "tiny.toml"), policy="mixed_float16")
    logits = [row for row in report["rows"] if row["path"] == "logits"]
    assert logits and logits[0]["island"] and "per-token logits" in logits[0]["reason"]
    assert report["risks"] == []
