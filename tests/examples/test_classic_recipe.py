"""The classic mixed-precision recipe of examples/classic_recipe through amptrain.Trainer:
its model's float32 island (quick); then, as the command a user runs (slow): the run
record and the telemetry under mixed_float16, the export against the test outputs, a
SIGKILL and a rerun ending on the uninterrupted run's weights, and `mirrored` over two
logical CPUs equal to one device."""

import json
import os
import signal
import sys
import time

import forked_cli  # tests/: a script forked after the import
import numpy as np
import pytest
from conftest import ROOT

from amptrain.engine.run_folder.checkpoint_files import step_prefixes
from amptrain.engine.run_log import read_metrics

EXAMPLE = os.path.join(ROOT, "examples", "classic_recipe", "classic_recipe.py")
TINY = ["--limit", "160", "--set", "train.steps=12", "--set", "runtime.steps_per_execution=4"]
TINY += ["--set", "train.log_every=4", "--set", "train.checkpoint_every=4", "--set", "train.eval_every=4"]
EXACT = ["--set", "precision.policy=float32", "--set", "runtime.deterministic=true"]


@pytest.fixture(scope="module")
def recipe():
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import classic_recipe

    return classic_recipe


def test_the_custom_attention_is_a_float32_island_under_mixed_float16(recipe):
    import keras

    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = recipe.build_transformer_model(vocabulary_size=50, max_length=16, hidden_dim=16)
    finally:
        keras.config.set_dtype_policy("float32")
    layers = {layer.name: layer for layer in model.layers}
    assert layers["custom_attention"].compute_dtype == "float32"
    assert layers["ffn_in"].compute_dtype == "float16" and layers["ffn_in"].variable_dtype == "float32"
    assert layers["logits"].compute_dtype == "float32"


def example(run_dir, *args, wait=True):
    """`python classic_recipe.py ...` as a user runs it, forked after the import (forked_cli.py)."""
    command = [EXAMPLE, "--run-dir", str(run_dir), *TINY, *args]
    if not wait:
        return forked_cli.start(python=command)
    result = forked_cli.python(command, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[0])


def weights(run_dir):
    """The model's variables in the run's newest checkpoint."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(step_prefixes(os.path.join(run_dir, "checkpoints"))[0])
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER" not in n]
    return {n: reader.get_tensor(n) for n in names}


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("classic") / "exact"
    example(run_dir, *EXACT)
    return run_dir


@pytest.mark.slow
def test_the_recipe_records_its_policy_loss_scale_and_skips_and_exports(tmp_path):
    import tensorflow as tf

    run_dir = tmp_path / "fp16"
    result = example(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    assert next(r for r in records if r["kind"] == "run")["policy"] == "mixed_float16"
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert all(r["loss_scale"] > 0 and r["skipped_steps"] >= 0 for r in train)
    tags = set()
    for path in tf.io.gfile.glob(str(run_dir / "tensorboard" / "train" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    assert {"precision/loss_scale", "precision/skipped_steps", "metrics/loss"} <= tags
    # The export: the model's own signature; its outputs are the final test's, row for row.
    serve = tf.saved_model.load(result["export"]).signatures["serving_default"]
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import classic_recipe

    features, _ = classic_recipe.load_spam(limit=160)["test"]
    exported = serve(token_ids=tf.constant(features["token_ids"]))["outputs"].numpy()
    tested = np.load(run_dir / "predictions-test.npy")
    np.testing.assert_allclose(exported, tested, atol=2e-2)  # float32 export against the fp16 run's test


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_weights(exact_run, tmp_path):
    run_dir = tmp_path / "killed"
    process = example(run_dir, *EXACT, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:  # until the checkpoint of step 8 is written
        if any(p.endswith("ckpt-8") for p in step_prefixes(str(run_dir / "checkpoints"))):
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not any(r["kind"] == "end" for r in read_metrics(run_dir / "metrics.jsonl"))
    example(run_dir, *EXACT)
    expected, resumed = weights(exact_run), weights(run_dir)
    assert expected.keys() == resumed.keys()
    for name in expected:
        np.testing.assert_array_equal(resumed[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_two_workers_equal_one_device(exact_run, tmp_path):
    """Two local workers (TF_CONFIG), each running the user's script as it is."""
    from amptrain.launch import free_ports, tf_configs

    run_dir = tmp_path / "workers"
    command = [EXAMPLE, "--run-dir", str(run_dir), *TINY, *EXACT]
    workers = [forked_cli.start(python=command, env={"TF_CONFIG": c}) for c in tf_configs(free_ports(2))]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (_, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-3000:]
    run = next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "run")
    assert run["strategy"] == "multi_worker" and run["num_workers"] == 2
    one, two = weights(exact_run), weights(run_dir)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_mirrored_over_two_logical_cpus_equals_one_device(exact_run, tmp_path):
    run_dir = tmp_path / "mirrored"
    example(run_dir, *EXACT, "--set", "runtime.strategy=mirrored", "--set", "runtime.cpu_replicas=2")
    run = next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "run")
    assert run["strategy"] == "mirrored" and run["num_replicas"] == 2
    one, two = weights(exact_run), weights(run_dir)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_auto_measures_the_recipe_and_bench_reports_mfu_for_every_row(recipe, tmp_path, monkeypatch):
    """`auto` on the recipe's own model (64 mails): the candidates built from its builder and
    timed, the choice with its candidates in the run record; then `Trainer.bench` on it: the
    report with real tokens/s and MFU in every row (MultiHeadAttention counted)."""
    from amptrain.autoprecision import measurement

    monkeypatch.setattr(measurement.Budget, "verdict", lambda self, candidate, speeds: None)  # build them all
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    data = recipe.load_spam(limit=64)
    settings = {"precision.policy": "auto", "runtime.jit_compile": "auto", "runtime.steps_per_execution": 1}
    trainer = recipe.trainer(data, str(tmp_path / "auto"), {**settings, "train.steps": 2}.items())
    trainer.fit()
    run = next(r for r in read_metrics(tmp_path / "auto" / "metrics.jsonl") if r["kind"] == "run")
    choice = run["precision_choice"]
    assert choice["source"] == "measured" and len(choice["candidates"]) >= 2
    assert all(c["tokens_per_second"] > 0 for c in choice["candidates"])
    assert (run["policy"], run["jit_compile"]) == (choice["policy"], choice["jit_compile"])

    results = trainer.bench(precisions=("float32",), jit=(False, True), steps_per_execution=(1,), steps=4, repeats=1)
    rows = results["rows"]
    assert [(r["precision"], r["jit"]) for r in rows] == [("float32", False), ("float32", True)]
    for row in rows:
        assert row["real_tokens_per_second"] > 0 and 0 < row["mfu"] < 1 and row["peak_memory_bytes"] > 0
    report = (tmp_path / "auto" / "bench" / "report.md").read_text()
    assert "your model: classic_recipe.build_transformer_model" in report and "MFU" in report
    assert {"results.json", "throughput.png", "memory.png"} <= set(os.listdir(tmp_path / "auto" / "bench"))
