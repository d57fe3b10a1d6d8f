"""The language model end to end (slow: real processes): the export generates in a Python
without amptrain what `amptrain predict` generates, and `amptrain serve` returns it over REST;
a killed fit resumes to the uninterrupted run's weights, bit for bit; a corpus ten times
larger trains in the same resident memory."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import forked_cli  # tests/: `amptrain` forked after the import
import pytest
from serving.test_serve_process import Server
from tasks.test_language_model import write_tiny_corpus

import amptrain
from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow
PROMPTS = ["And God said", "In the beginning", ""]

FRESH_PYTHON = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizer's ops)
assert "amptrain" not in sys.modules
loaded = tf.saved_model.load(sys.argv[1])
prompts = json.loads(sys.stdin.read())
greedy = loaded.signatures["serving_default"](text=tf.constant(prompts))["generated"].numpy()
sampled = loaded.signatures["generate"](
    text=tf.constant(prompts), max_new_tokens=tf.constant(6), temperature=tf.constant(1.0),
    top_k=tf.constant(0), top_p=tf.constant(0.9), seed=tf.constant(5),
)["generated"].numpy()
print(json.dumps({"greedy": [g.decode("utf-8", "replace") for g in greedy],
                  "sampled": [s.decode("utf-8", "replace") for s in sampled]}))
"""


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    folder = write_tiny_corpus(tmp_path_factory.mktemp("lm-run"))
    amptrain.fit(str(folder / "tiny.toml"), {"train.steps": 24}, run_dir=str(folder / "run"))
    return folder


def test_the_export_generates_without_amptrain_what_predict_does_and_serve_answers_it(lm_run):
    run = lm_run / "run"
    amptrain.export(str(run))
    records = amptrain.predict(str(run), PROMPTS)
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PYTHON, str(run / "export" / "1")],
        input=json.dumps(PROMPTS), capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(done.stdout.strip().splitlines()[-1])
    assert fresh["greedy"] == [r["generated"] for r in records]
    settings = ["generate.max_new_tokens=6", "generate.temperature=1.0", "generate.top_p=0.9", "generate.seed=5"]
    sampled = amptrain.predict(str(run), PROMPTS, overrides=settings)
    assert fresh["sampled"] == [r["generated"] for r in sampled]  # the same seed, the same text
    assert amptrain.predict(str(run / "export"), PROMPTS) == records
    server = Server(run / "export", lm_run)
    try:
        status, answer = server.predict({"instances": PROMPTS})
        assert status == 200 and answer == {"predictions": [r["generated"] for r in records]}
    finally:
        assert server.stop() == 0


def test_sampling_is_per_prompt_in_predict_the_export_and_under_concurrent_serving(lm_run):
    from concurrent.futures import ThreadPoolExecutor

    run = lm_run / "run"
    sampling = ["generate.temperature=1.0", "generate.seed=11", "generate.max_new_tokens=6"]
    amptrain.export(str(run), version=2, overrides=sampling)
    alone = amptrain.predict(str(run), ["And God said"], overrides=sampling)[0]["generated"]
    second = amptrain.predict(str(run), ["In the beginning", "And God said"], overrides=sampling)[1]["generated"]
    exported = amptrain.predict(str(run / "export" / "2"), ["In the beginning", "And God said"])[1]["generated"]
    assert alone == second == exported
    flags = ["--temperature", "1", "--seed", "11", "--max-new-tokens", "6", "--json"]
    done = forked_cli.run(["predict", str(run / "export" / "2"), "--text", "And God said", *flags])
    assert done.returncode == 0 and json.loads(done.stdout.strip())["generated"] == alone
    done = forked_cli.run(["predict", str(run / "export" / "2"), "--text", "x", "--top-p", "nan"])
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "generate.top_p: expected a number in (0, 1], received nan"
    )
    server = Server(run / "export", lm_run)
    try:
        bodies = [{"instances": ["And God said"]}, {"instances": ["In the beginning", "And God said"]}] * 5
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(server.predict, bodies))
        assert {a[1]["predictions"][-1] for a in answers} == {alone}
        status, answer = server.predict({"signature_name": "serve_token_ids", "instances": [[1] * 40]})
        assert status == 400 and "a row longer than 31 pieces" in answer["error"]
    finally:
        assert server.stop() == 0


def fit_args(folder, run_dir, *settings):
    args = ["fit", str(folder / "tiny.toml"), "--run-dir", str(run_dir)]
    for setting in ("runtime.deterministic=true", "train.steps=40", "train.checkpoint_every=8", *settings):
        args += ["--set", setting]
    return args


def test_a_killed_fit_resumes_to_the_uninterrupted_weights_bit_for_bit(lm_run):
    interrupted = lm_run / "interrupted"
    process = forked_cli.start(fit_args(lm_run, interrupted))
    deadline = time.time() + 300
    while '"ckpt-16"' not in _state(interrupted):
        assert process.poll() is None and time.time() < deadline, "fit ended before it could be interrupted"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -9
    hashes = []
    for run_dir in (interrupted, lm_run / "uninterrupted"):
        result = forked_cli.run(fit_args(lm_run, run_dir), timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        hashes.append(re.search(r"final weights (\w+)", result.stderr).group(1))
    assert hashes[0] == hashes[1]
    runs = [r for r in read_metrics(interrupted / "metrics.jsonl") if r["kind"] == "run"]
    assert runs[-1]["resumed_from_step"] >= 16


def _state(run_dir):
    try:
        return (run_dir / "checkpoints" / "checkpoint").read_text()
    except FileNotFoundError:
        return ""


def test_a_corpus_ten_times_larger_trains_in_the_same_memory(lm_run, tmp_path):
    """Resident memory at the same step, the shipped slice against it repeated ten times."""
    text = (lm_run / "train.txt").read_text(encoding="utf-8")
    (tmp_path / "large.txt").write_text((text.rstrip("\n") + "\n\n") * 10, encoding="utf-8")
    memory = []
    for name, train in (("small", lm_run / "train.txt"), ("large", tmp_path / "large.txt")):
        settings = [f"data.train={train}", "train.steps=16", "train.log_every=16", "train.eval_every=16"]
        result = forked_cli.run(["fit", str(lm_run / "tiny.toml"), "--run-dir", str(tmp_path / name)]
                                + [a for s in settings for a in ("--set", s)], timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        (record,) = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["kind"] == "train"]
        memory.append(record["memory_bytes"])
    assert memory[1] <= memory[0] * 1.10, memory
