"""Each family's tiny checkpoint through the shipped `*-minilm.toml` configs (`--set
model.pretrained=FOLDER`, the tiny data splits): fit, `eval`, `predict` and an export equal
to `predict`, for classification and NER. Slow: each trains runs; one fresh process serves
every export (TensorFlow and TensorFlow Text only)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

import amptrain

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
# One task a family, within the full tier's budget (each fit, predict and export costs about
# 40 s here): NER on a byte-level BPE and a SentencePiece family, where the first piece of a
# word is found differently; classification on the others. BERT runs both (test_pretrained_runs).
FAMILY_TASKS = [
    ("roberta", "ner"),
    ("albert", "ner"),
    ("xlm-roberta", "classification"),
    ("distilbert", "classification"),
]
TINY = [
    "train.steps=2",
    "train.batch_size=8",
    "train.warmup_steps=0",
    "train.ema_decay=0",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.log_every=1",
    "precision.policy=float32",
    "runtime.jit_compile=false",
    "runtime.steps_per_execution=1",
    "data.max_length=32",
]
TEXTS = ["WIN a FREE cruise!!! Click http://example.com now", "Grüße aus München " * 20, "ok"]
SENTENCES = ["@john_doe went to New York with #Obama", "Barack Obama " * 30]  # the second is cut

# Loads each export with TensorFlow alone and prints the serving outputs of its texts as JSON.
SERVE_ALL = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizers' ops)
results = []
for path, texts in json.loads(sys.stdin.read()):
    outputs = tf.saved_model.load(path).signatures["serving_default"](text=tf.constant(texts))
    results.append({k: v.numpy().tolist() for k, v in outputs.items()})
assert not [m for m in sys.modules if m.split(".")[0] == "amptrain"], "the export imported amptrain"
print(json.dumps(results, default=lambda b: b.decode()))
"""


def data_overrides(tiny, tiny_ner, task):
    if task == "classification":
        train, dev = tiny / "train.csv", tiny / "dev.csv"
    else:
        train, dev = tiny_ner / "train.conll", tiny_ner / "dev.conll"
    return [f"data.train={train}", f"data.dev={dev}", f"data.test={dev}"]


@pytest.fixture
def runs(tiny, tiny_ner, tmp_path):
    """{(family, task): (run folder, its predictions)} of a tiny fit on each family and task."""
    results = {}
    configs = {"classification": ("classify-spam-minilm.toml", TEXTS), "ner": ("ner-wnut17-minilm.toml", SENTENCES)}
    for family, task in FAMILY_TASKS:
        for config, texts in [configs[task]]:
            run = str(tmp_path / f"{family}-{task}")
            overrides = [f"model.pretrained={HERE}/tiny-{family}", *TINY, *data_overrides(tiny, tiny_ner, task)]
            if task == "ner":
                overrides.append("data.num_buckets=2")
            result = amptrain.fit(os.path.join(ROOT, "configs", config), overrides, run_dir=run)
            metric = "accuracy" if task == "classification" else "entity_f1"
            assert np.isfinite(result["test"][metric])
            if task == "ner":  # `eval` once a family (the BERT runs check it for both tasks)
                assert amptrain.evaluate(run)[metric] == result["test"][metric]
            amptrain.export(run)
            results[family, task] = (run, amptrain.predict(run, texts))
    return results


def test_every_family_fits_evaluates_predicts_and_exports_as_predict(runs):
    jobs = [
        [os.path.join(run, "export", "1"), TEXTS if task == "classification" else SENTENCES]
        for (_, task), (run, _) in runs.items()
    ]
    done = subprocess.run(
        [sys.executable, "-c", SERVE_ALL],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served_all = json.loads(done.stdout.strip().split("\n")[-1])
    for ((family, task), (run, records)), served in zip(runs.items(), served_all):
        if task == "classification":
            assert served["label"] == [r["label"] for r in records], family
            labels = json.loads(open(os.path.join(run, "labels.json")).read())
            expected = np.array([[r["probabilities"][name] for name in labels] for r in records])
            assert np.abs(np.array(served["probabilities"]) - expected).max() <= 1e-5, family
        else:
            assert records[0]["tokens"][:2] == ["@john_doe", "went"]
            for i, record in enumerate(records):
                assert served["tags"][i][: served["num_words"][i]] == record["tags"], family
