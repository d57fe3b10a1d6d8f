"""Every amptrain feature with a pretrained encoder (the tiny random BERT of
tests/pretrained/tiny-bert/): the three policies with loss scaling and XLA, steps per
execution, accumulation and the weight average; mirrored over 2 logical CPUs and 2 workers
through `amptrain launch`, giving one device's weights; a killed run resumed exactly; `audit`; `bench`."""

import json
import os
import signal
import time

import forked_cli  # tests/: `amptrain` forked after the import
import numpy as np
import pytest
from engine.test_distribution import amptrain_cli, assert_close, weights
from engine.test_resume import committed

import amptrain
from amptrain import cli
from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow

SAME_RUN = [
    "runtime.deterministic=true",
    "model.dropout=0.0",
    "precision.policy=float32",
    "runtime.jit_compile=false",
    "runtime.steps_per_execution=2",
    "train.steps=4",
    "train.eval_every=4",
    "train.checkpoint_every=4",
    "data.num_buckets=1",
]


def train_records(run_dir):
    return [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "train"]


def test_float16_with_xla_steps_per_execution_accumulation_and_the_average(tiny_pretrained, tmp_path):
    """float16 with its dynamic loss scale, XLA, 2 steps a call, 2 micro-batches a step, the weight average."""
    run = str(tmp_path / "run")
    sets = [
        "precision.policy=mixed_float16",
        "runtime.jit_compile=true",
        "runtime.steps_per_execution=2",
        "train.accumulation_steps=2",
        "train.ema_decay=0.9",
        "train.steps=4",
        "train.log_every=2",
        "data.num_buckets=1",
    ]
    result = amptrain.fit(str(tiny_pretrained), sets, run_dir=run)
    records = train_records(run)
    assert [r["step"] for r in records] == [2, 4] and all(np.isfinite(r["loss"]) for r in records)
    assert records[-1]["loss_scale"] > 1 and records[-1]["skipped_steps"] <= 1
    assert "accuracy" in result["test"]


def test_a_killed_bfloat16_run_resumes_as_an_uninterrupted_one(tiny_pretrained, tmp_path):
    """A resumed run rebuilds the encoder from the checkpoint folder, then restores the run's
    own checkpoint over it: its weights at the end equal an uninterrupted run's."""
    sets = [s for s in SAME_RUN if not s.startswith(("train.steps", "precision.policy", "train.checkpoint_every"))]
    sets += ["precision.policy=mixed_bfloat16", "train.steps=8", "train.checkpoint_every=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    amptrain.fit(str(tiny_pretrained), sets, run_dir=str(straight))
    command = ["fit", str(tiny_pretrained), "--run-dir", str(resumed)]
    process = forked_cli.start(command + sum((["--set", s] for s in sets), []))  # forked after the import
    deadline = time.time() + 300
    while not committed(resumed, 4):
        assert process.poll() is None and time.time() < deadline, "fit ended before it could be interrupted"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -9
    amptrain.fit(str(tiny_pretrained), sets, run_dir=str(resumed))
    runs = [r for r in read_metrics(os.path.join(resumed, "metrics.jsonl")) if r["kind"] == "run"]
    assert runs[-1]["resumed_from_step"] >= 4
    a, b = weights(str(straight), 8), weights(str(resumed), 8)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_mirrored_and_two_workers_give_one_devices_weights(tiny_pretrained, tmp_path):
    one = str(tmp_path / "one")
    amptrain.fit(str(tiny_pretrained), SAME_RUN, run_dir=one)
    sets = sum((["--set", s] for s in SAME_RUN), [])
    mirrored = str(tmp_path / "mirrored")
    result = amptrain_cli(
        ["fit", str(tiny_pretrained), "--run-dir", mirrored, *sets]
        + ["--set", "runtime.strategy=mirrored", "--set", "runtime.cpu_replicas=2"]
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_close(weights(one, 4), weights(mirrored, 4), "float32")
    launched = str(tmp_path / "launched")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = amptrain_cli(
        ["launch", "--workers", "2", str(tiny_pretrained), "--run-dir", launched, *sets], env={"TMPDIR": str(scratch)}
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_close(weights(one, 4), weights(launched, 4), "float32")


def test_audit_under_float16_finds_no_half_precision_softmax_or_norm(tiny_pretrained):
    report = amptrain.audit(str(tiny_pretrained), policy="mixed_float16")
    kinds = {finding["kind"] for finding in report["risks"]}
    # What is left is the checkpoint's own shapes (441 pieces, 2 segments): not amptrain's to change.
    assert kinds <= {"size_alignment"}, report["risks"]
    islands = {row["path"]: row for row in report["rows"] if "softmax" in row["path"]}
    assert islands and all(row.get("island") for row in islands.values()), islands


def test_bench_times_a_pretrained_config(tiny_pretrained, tmp_path, capsys):
    args = ["bench", str(tiny_pretrained), "--run-dir", str(tmp_path / "run"), "--precisions", "mixed_bfloat16"]
    status = cli.main(args + ["--jit", "off", "--steps-per-execution", "1", "--steps", "2", "--repeats", "1"])
    assert status == 0, capsys.readouterr()
    (row,) = json.loads((tmp_path / "run" / "bench" / "results.json").read_text())["rows"]
    assert row["precision"] == "mixed_bfloat16" and row["real_tokens_per_second"] > 0


def test_the_export_of_a_pretrained_classifier_and_tagger_equals_predict(tiny_pretrained, tiny_ner, tmp_path):
    """`amptrain export` tokenizes as the checkpoint was trained: [CLS] ... [SEP]."""
    from conftest import pretrained_config
    from export.test_export_runs import serve_in_fresh_process

    texts = ["WIN a FREE cruise, click now", "see you at lunch " * 20, "ok"]  # the second is cut at 32 pieces
    run = tmp_path / "classify"
    amptrain.fit(str(tiny_pretrained), ["train.steps=2", "precision.policy=float32"], run_dir=str(run))
    amptrain.export(str(run))
    served, records = serve_in_fresh_process(run / "export" / "1", texts), amptrain.predict(str(run), texts)
    assert served["label"] == [r["label"] for r in records]
    labels = json.loads((run / "labels.json").read_text())
    expected = np.array([[r["probabilities"][name] for name in labels] for r in records])
    assert np.abs(np.array(served["probabilities"]) - expected).max() <= 1e-5

    config = tmp_path / "ner.toml"
    config.write_text(pretrained_config((tiny_ner / "tiny.toml").read_text()))
    run = tmp_path / "ner"
    amptrain.fit(str(config), ["train.steps=2", "precision.policy=float32"], run_dir=str(run))
    amptrain.export(str(run))
    texts = ["@john_doe went to New York with #Obama", "Barack Obama " * 30]  # the second is cut at 64 pieces
    served, records = serve_in_fresh_process(run / "export" / "1", texts), amptrain.predict(str(run), texts)
    for i, record in enumerate(records):
        assert served["tags"][i][: served["num_words"][i]] == record["tags"]
