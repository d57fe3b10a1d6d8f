"""Each family's tiny checkpoint through the shipped `*-minilm.toml` configs (`--set
model.pretrained=FOLDER`, the tiny data splits): fit, `eval`, `predict` and an export equal
to `predict`, for classification and NER, each run under its own precision and XLA mode so
that every policy and mode meets a family of each tokenizer kind; then a resume on changed
weights, refused. Slow: a test a family and task (a fit, an export), and one fresh process
serves every export (TensorFlow and TensorFlow Text only). BERT runs both tasks in
test_pretrained_runs.py."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

import amptrain
from amptrain.config import ConfigError
from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
# (policy, runtime.jit_compile) of each family's classification and NER run. Each family has
# a float32 run, whose export (float32) must equal `predict` to 1e-5 (the pairs
# checked so: NER on RoBERTa and ALBERT, classification on XLM-R and DistilBERT); bf16 and fp16 (with its
# loss scale) each meet both tasks and two XLA modes (float32 under whole XLA is BERT's, in
# test_pretrained_features.py, and the strategy matrix's); a mixed classifier's export is
# checked against `predict` within its policy's rounding (EXPORT_TOLERANCE), a mixed tagger's
# for its tokenization (one tag a word: a tiny tagger's near-ties may flip a tag).
PRECISION = {
    ("roberta", "classification"): ("mixed_bfloat16", "true"),
    ("roberta", "ner"): ("float32", "false"),
    ("albert", "classification"): ("mixed_float16", "false"),
    ("albert", "ner"): ("float32", '"fusible"'),
    ("xlm-roberta", "classification"): ("float32", "false"),
    ("xlm-roberta", "ner"): ("mixed_float16", "true"),
    ("distilbert", "classification"): ("float32", "false"),
    ("distilbert", "ner"): ("mixed_bfloat16", '"fusible"'),
}
# How far the float32 export's probabilities may be from `predict` under the run's policy:
# measured 4e-7 (float32), 7.8e-5 (float16, ALBERT), 2.9e-3 (bf16 + XLA, RoBERTa).
EXPORT_TOLERANCE = {"float32": 1e-5, "mixed_float16": 2e-3, "mixed_bfloat16": 2e-2}
TINY = [
    "train.steps=2",
    "train.batch_size=8",
    "train.warmup_steps=0",
    "train.ema_decay=0",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.log_every=1",
    "runtime.steps_per_execution=1",
    "data.max_length=32",
]
TEXTS = ["WIN a FREE cruise!!! Click http://example.com now", "Grüße aus München " * 20, "ok"]
SENTENCES = ["@john_doe went to New York with #Obama", "Barack Obama " * 30]  # the second is cut

# Loads exports with TensorFlow alone: for each line of stdin (an export's path and texts) it
# prints the serving outputs as one JSON line. One process serves the module's tests.
SERVE_LOOP = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizers' ops)
print("ready", flush=True)
for line in sys.stdin:
    path, texts = json.loads(line)
    outputs = tf.saved_model.load(path).signatures["serving_default"](text=tf.constant(texts))
    assert not [m for m in sys.modules if m.split(".")[0] == "amptrain"], "the export imported amptrain"
    print(json.dumps({k: v.numpy().tolist() for k, v in outputs.items()}, default=lambda b: b.decode()), flush=True)
"""


@pytest.fixture(scope="module")
def serve():
    """serve(export folder, texts) -> the export's outputs, from a process that never imports amptrain."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_LOOP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert process.stdout.readline().strip() == "ready"

    def served(path, texts):
        process.stdin.write(json.dumps([path, texts]) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        assert line, f"the serving process ended (exit {process.poll()}) on {path}"
        return json.loads(line)

    yield served
    process.stdin.close()
    process.wait(timeout=60)


def data_overrides(tiny, tiny_ner, task):
    if task == "classification":
        train, dev = tiny / "train.csv", tiny / "dev.csv"
    else:
        train, dev = tiny_ner / "train.conll", tiny_ner / "dev.conll"
    return [f"data.train={train}", f"data.dev={dev}", f"data.test={dev}"]


CONFIGS = {"classification": ("classify-spam-minilm.toml", TEXTS), "ner": ("ner-wnut17-minilm.toml", SENTENCES)}


def fit_checked(config, overrides, run, policy, jit):
    """A tiny fit that trains under `policy` and `jit` (the run record says so, the loss is
    finite; fp16's dynamic loss scale may skip the first step), scored again by `eval`."""
    result = amptrain.fit(config, overrides, run_dir=run)
    records = read_metrics(os.path.join(run, "metrics.jsonl"))
    record = next(r for r in records if r["kind"] == "run")
    assert (record["policy"], json.dumps(record["jit_compile"])) == (policy, jit), record
    trained = [r for r in records if r["kind"] == "train"]
    assert trained and np.isfinite(trained[-1]["loss"])
    if policy == "mixed_float16":
        assert trained[-1]["loss_scale"] > 1 and trained[-1]["skipped_steps"] <= 1
    else:
        assert all(np.isfinite(r["loss"]) for r in trained)
    metric = "accuracy" if "classify" in config else "entity_f1"
    assert np.isfinite(result["test"][metric])
    assert amptrain.evaluate(run)[metric] == pytest.approx(result["test"][metric], abs=1e-6)


@pytest.mark.parametrize(("family", "task"), list(PRECISION), ids=[f"{f}-{t}" for f, t in PRECISION])
def test_the_family_fits_evaluates_predicts_and_exports_as_predict(family, task, tiny, tiny_ner, serve, tmp_path):
    policy, jit = PRECISION[family, task]
    weights = shutil.copytree(os.path.join(HERE, f"tiny-{family}"), tmp_path / "weights")
    config, texts = os.path.join(ROOT, "configs", CONFIGS[task][0]), CONFIGS[task][1]
    overrides = [f"model.pretrained={weights}", *TINY, *data_overrides(tiny, tiny_ner, task)]
    overrides += [f"precision.policy={policy}", f"runtime.jit_compile={jit}"]
    overrides += ["data.num_buckets=2"] if task == "ner" else []
    run = str(tmp_path / "run")
    fit_checked(config, overrides, run, policy, jit)
    amptrain.export(run)
    records = amptrain.predict(run, texts)
    served = serve(os.path.join(run, "export", "1"), texts)
    exact = policy == "float32"  # the export computes in float32
    if task == "classification":
        labels = json.loads(open(os.path.join(run, "labels.json")).read())
        assert len(served["label"]) == len(records) and set(served["label"]) <= set(labels)
        expected = np.array([[r["probabilities"][name] for name in labels] for r in records])
        assert np.abs(np.array(served["probabilities"]) - expected).max() <= EXPORT_TOLERANCE[policy]
        if exact:
            assert served["label"] == [r["label"] for r in records]
    else:
        assert records[0]["tokens"][:2] == ["@john_doe", "went"]
        assert served["num_words"] == [len(r["tags"]) for r in records]
        for i, record in enumerate(records):
            if exact:
                assert served["tags"][i][: served["num_words"][i]] == record["tags"]

    # Resuming after the checkpoint's weights changed under the same path is refused.
    data = bytearray((weights / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (weights / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="other weights than the run was trained from"):
        amptrain.fit(config, [*overrides, "train.steps=4"], run_dir=run)


@pytest.mark.parametrize("family", sorted({f for f, _ in PRECISION}))
def test_the_family_under_float16_has_no_half_precision_softmax_or_norm(family, tiny, tiny_ner):
    """`amptrain.audit` of each family's classifier and tagger under mixed_float16: the
    softmax of every attention layer a float32 island (ALBERT's shared block has one), and no
    risk but the checkpoint's own sizes (a tiny random vocabulary is not a multiple of 8): no
    softmax, norm or variance in float16 (Keras's layer norm takes its moments in float32),
    no layer ignoring the policy, no float32 layer fed float16 uncast. As for BERT in
    test_pretrained_features.py."""
    for task, (config, _) in CONFIGS.items():
        overrides = [f"model.pretrained={os.path.join(HERE, f'tiny-{family}')}", *data_overrides(tiny, tiny_ner, task)]
        report = amptrain.audit(os.path.join(ROOT, "configs", config), overrides, policy="mixed_float16")
        assert {finding["kind"] for finding in report["risks"]} <= {"size_alignment"}, (task, report["risks"])
        softmax = [row for row in report["rows"] if "softmax" in row["path"]]
        assert softmax and all(row.get("island") for row in softmax), (task, softmax)
