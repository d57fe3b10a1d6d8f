"""Distribution gives the answer of one device: mirrored over 2 logical CPUs in
mixed_float16, gradient accumulation; a batch the replicas cannot split is refused; a lost
worker is named. Every strategy x XLA x task in float32 (mirrored, 2 local workers through
`amptrain launch`): tests/test_strategy_matrix.py.

Logical CPU devices and multi-worker collectives must be set up before TensorFlow
starts, so those runs are `amptrain` processes of their own; the one-device runs they
are compared with run here.

Tolerance: the root-mean-square and the largest difference over all trainable weights
after 8 steps of Adam (lr 3e-3), measured on the 2-core CPU this was written on (TF 2.21,
Keras 3.15): float32 RMS 6.4e-8, largest 3.4e-6; mixed_float16 RMS 1.1e-4, largest
3.7e-3, which is what float16 rounding alone makes (one device, mixed_float16 against
float32: RMS 8.3e-5, largest 3.4e-3). The replicas sum their gradients in another order
than one device, and Adam divides by sqrt(v): the attention's key bias, whose gradient is
zero but for rounding, moves by about a learning rate in a direction the rounding picks.
The bounds are 5-30x the measurements.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import amptrain
from amptrain import distribute
from amptrain.engine.run_log import read_metrics
from amptrain.engine.step_runner import StepRunner
from amptrain.errors import ConfigError
from amptrain.precision.loss_scale import LossScaler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import forked_cli  # noqa: E402  (tests/: on the path as the conftest's folder)
from poisoned import poisoned_model, squared_error  # noqa: E402

TOLERANCE = {"float32": (1e-6, 1e-4), "mixed_float16": (5e-4, 1.5e-2)}  # (RMS, largest)
# Deterministic, no dropout (each replica would draw its own masks), a loss scale that
# does not overflow on this model, and 8 steps in 2 graph calls of 4.
SAME_RUN = [
    "runtime.deterministic=true",
    "model.dropout=0.0",
    "precision.initial_scale=1024",
    "runtime.steps_per_execution=4",
    "train.steps=8",
    "train.eval_every=8",
    "train.checkpoint_every=8",
]


def amptrain_cli(args, env=None, timeout=600):
    """`amptrain ARGS` in a process of its own, forked after the import (tests/forked_cli.py)."""
    return forked_cli.run(args, env={"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}, timeout=timeout)


def weights(run_dir, step=8):
    """The model's variables in a run's checkpoint of `step`, by checkpoint key."""
    reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        # The trainable weights sit in the checkpoint under the optimizer's list of them.
        if name.startswith("optimizer/_trainable_variables/")
    }


def differences(a, b):
    """(root mean square, largest) absolute difference over all weights of two runs."""
    assert a.keys() == b.keys() and a
    d = np.concatenate([(a[k] - b[k]).ravel() for k in sorted(a)])
    return float(np.sqrt(np.mean(d**2))), float(np.max(np.abs(d)))


def assert_close(a, b, policy):
    (rms, largest), (rms_bound, largest_bound) = differences(a, b), TOLERANCE[policy]
    assert rms < rms_bound and largest < largest_bound, (rms, largest)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, spam_rows):
    """The tiny spam run on one device, per policy (made on first use)."""
    from conftest import write_tiny

    folder = write_tiny(tmp_path_factory.mktemp("dist"), spam_rows)
    config = folder / "tiny.toml"
    runs = {}

    def run(policy):
        if policy not in runs:
            run_dir = folder / f"one-{policy}"
            amptrain.fit(str(config), SAME_RUN + [f"precision.policy={policy}"], run_dir=str(run_dir))
            runs[policy] = str(run_dir)
        return runs[policy]

    run.config = config
    run.folder = folder
    return run


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16"])  # float32: every cell of tests/test_strategy_matrix.py
def test_mirrored_over_two_cpus_equals_one_device(one_device, policy):
    mirrored = str(one_device.folder / f"mirrored-{policy}")
    overrides = SAME_RUN + [f"precision.policy={policy}", "runtime.strategy=mirrored", "runtime.cpu_replicas=2"]
    result = amptrain_cli(
        ["fit", str(one_device.config), "--run-dir", mirrored, *sum((["--set", o] for o in overrides), [])]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = [r for r in read_metrics(os.path.join(mirrored, "metrics.jsonl")) if r["kind"] == "run"][0]
    assert (run["strategy"], run["num_replicas"], run["num_workers"]) == ("mirrored", 2, 1)
    assert "global batch 8 (4 a replica)" in result.stderr
    assert_close(weights(one_device(policy)), weights(mirrored), policy)


def micro_batch_trainer(accumulation_steps, scaler=None):
    keras.utils.set_random_seed(0)
    model = poisoned_model()
    optimizer = keras.optimizers.Adam(0.05)
    optimizer.build(model.trainable_variables)
    return StepRunner(
        tf.distribute.get_strategy(),
        model,
        optimizer,
        squared_error,
        loss_scale=scaler,
        accumulation_steps=accumulation_steps,
    )


def rows(n, poisons=None):
    """`n` regression rows with different inputs and targets (one batch)."""
    x = np.linspace(-1, 1, 3 * n, dtype=np.float32).reshape(n, 3)
    poison = np.ones(n, np.float32) if poisons is None else np.asarray(poisons, np.float32)
    targets = np.linspace(0.5, 2.0, n, dtype=np.float32)
    return {"x": x, "poison": poison}, targets, np.ones((n, 2), np.int32)


def test_accumulating_k_micro_batches_equals_one_k_times_larger_batch():
    features, targets, counts = rows(8)
    big = tf.data.Dataset.from_tensors((features, targets, counts)).repeat()
    small = tf.data.Dataset.from_tensor_slices((features, targets, counts)).batch(2).repeat()  # 4 micro-batches of 2
    one = micro_batch_trainer(1)
    accumulating = micro_batch_trainer(4)
    totals_one = one.train(iter(big), 3)
    totals_acc = accumulating.train(iter(small), 3)
    for a, b in zip(one.model.trainable_variables, accumulating.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert int(accumulating.optimizer.iterations.numpy()) == 3 and int(accumulating.step.numpy()) == 3
    assert totals_acc["loss_total"] == pytest.approx(totals_one["loss_total"], rel=1e-5)
    assert list(totals_acc["tokens"]) == list(totals_one["tokens"]) == [24, 24]  # 8 rows x 3 steps


def test_an_overflowing_micro_batch_skips_the_whole_accumulated_step():
    features, targets, counts = rows(4, poisons=[1, 1, 1, float("inf")])
    trainer = micro_batch_trainer(2, LossScaler(1024.0))
    before = [v.numpy().copy() for v in trainer.model.trainable_variables]
    totals = trainer.train(iter(tf.data.Dataset.from_tensor_slices((features, targets, counts)).batch(2)), 1)
    assert int(totals["overflow_steps"]) == 1 and int(totals["applied_steps"]) == 0
    assert trainer.loss_scale.scale.numpy() == 512.0 and int(trainer.optimizer.iterations.numpy()) == 0
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, trainer.model.trainable_variables))


def test_fit_with_accumulation_counts_steps_as_updates(tiny):
    run_dir = tiny / "accumulated"
    amptrain.fit(
        str(tiny / "tiny.toml"),
        ["train.accumulation_steps=3", "train.steps=4", "train.checkpoint_every=2"],
        run_dir=str(run_dir),
    )
    records = read_metrics(run_dir / "metrics.jsonl")
    run = [r for r in records if r["kind"] == "run"][0]
    # 96 examples in batches of 8: 12 batches an epoch, so 4 steps of 3 micro-batches.
    assert run["accumulation_steps"] == 3 and run["total_steps"] == 4
    assert [r["kind"] for r in records][-1] == "end" and records[-1]["step"] == 4


def test_global_batch_must_split_evenly():
    class ThreeReplicas:
        num_replicas_in_sync = 3

    with pytest.raises(
        ConfigError, match=r"train.batch_size: expected a multiple of the 3 replicas .* received 8; try 6 or 9"
    ):
        distribute.check_batch_size(8, ThreeReplicas())
    distribute.check_batch_size(9, ThreeReplicas())


def test_token_batches_must_split_evenly():
    from amptrain.data.batching import rows_for_tokens

    class Replicas:
        def __init__(self, n):
            self.num_replicas_in_sync = n

    def buckets(tokens):  # buckets of 24 and 40 pieces
        return tuple(zip((24, 40), rows_for_tokens((24, 40), tokens)))

    assert buckets(320) == ((24, 8), (40, 8)) and buckets(100) == ((24, 4), (40, 2))
    distribute.check_token_batches(buckets(320), 320, Replicas(8))
    distribute.check_token_batches(buckets(100), 100, Replicas(2))
    with pytest.raises(
        ConfigError,
        match=r"data.tokens_per_batch: every batch must split evenly over the 4 replicas, "
        r"but 100 tokens give batches of 2 rows of 40 pieces; raise it to at least 320",
    ):
        distribute.check_token_batches(buckets(100), 100, Replicas(4))
    with pytest.raises(
        ConfigError,
        match=r"over the 3 replicas, but 320 tokens give batches of 8 rows of 40 pieces; "
        r"a token batch has a multiple of 8 rows where 8 fit: use a replica count",
    ):
        distribute.check_token_batches(buckets(320), 320, Replicas(3))


@pytest.mark.slow
def test_replicas_that_cannot_split_the_batch_are_refused_before_any_work(tiny):
    run_dir = tiny / "three"
    result = amptrain_cli(
        [
            "fit",
            str(tiny / "tiny.toml"),
            "--run-dir",
            str(run_dir),
            "--set",
            "runtime.strategy=mirrored",
            "--set",
            "runtime.cpu_replicas=3",
        ]
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "amptrain: error: train.batch_size: expected a multiple of the 3 replicas (it is the global batch, "
        "split evenly), received 8; try 6 or 9"
    )
    # Nothing was read, learned or built: no vocabulary, no labels, no checkpoint.
    # Nothing learned or trained: the config, the log, and the run folder's lock (engine/run_folder/lock.py)
    assert sorted(os.listdir(run_dir)) == [".amptrain-run.json", ".lock", "config.toml", "train.log"]


def test_strategy_selection_and_its_errors(tiny):
    from amptrain.config import load_config

    def runtime(*overrides):
        return load_config(tiny / "tiny.toml", list(overrides)).runtime

    placement = distribute.select_strategy(runtime(), distribute.Cluster())
    assert placement.name == "one_device" and placement.strategy.num_replicas_in_sync == 1
    with pytest.raises(ConfigError, match="expected TF_CONFIG to name a cluster of 2 or more workers"):
        distribute.select_strategy(runtime("runtime.strategy=multi_worker"), distribute.Cluster())
    with pytest.raises(ConfigError, match="no TPU named or attached"):
        distribute.select_strategy(runtime("runtime.strategy=tpu"), distribute.Cluster())
    with pytest.raises(ConfigError, match=r"runtime.devices: /gpu:7 not found"):
        distribute.select_strategy(runtime("runtime.strategy=mirrored", "runtime.devices=/gpu:7"), distribute.Cluster())
    with pytest.raises(ConfigError, match="runtime.strategy: expected one of"):
        runtime("runtime.strategy=horovod")


def test_tf_config_names_this_worker():
    spec = {"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"]}, "task": {"type": "worker", "index": 1}}
    cluster = distribute.Cluster.from_env({"TF_CONFIG": json.dumps(spec)})
    assert (cluster.num_workers, cluster.index, cluster.is_chief) == (3, 2, False)
    assert cluster.name(0) == "worker 0 (a:1)"
    assert distribute.Cluster.from_env({}).is_chief and not distribute.Cluster.from_env({}).is_multi_worker
    with pytest.raises(ConfigError, match="TF_CONFIG: expected JSON"):
        distribute.Cluster.from_env({"TF_CONFIG": "{not json"})


def test_a_lost_peer_is_named():
    cluster = distribute.Cluster(2, 0, "worker", ("localhost:1000", "localhost:1001"))
    # The message TensorFlow 2.21 gave here when worker 1 was killed between collectives.
    error = tf.errors.UnavailableError(
        None,
        None,
        "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are "
        "unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed.",
    )
    message = distribute.explain_lost_peer(error, cluster)
    assert message.startswith(
        "worker 0 (localhost:1000) of 2: lost worker 1 (localhost:1001): it stopped sending heartbeats"
    )
    assert distribute.explain_lost_peer(ValueError("x"), cluster) is None
    assert distribute.explain_lost_peer(error, distribute.Cluster()) is None


@pytest.mark.slow
def test_a_killed_worker_stops_the_other_and_a_relaunch_resumes(tiny):
    """Kill worker 1 mid-run: worker 0 stops by itself, naming it, within 60 s; the same
    launch again resumes from the chief's last checkpoint and ends at the same step."""
    run_dir = tiny / "killed"
    args = [
        "launch",
        "--workers",
        "2",
        str(tiny / "tiny.toml"),
        "--run-dir",
        str(run_dir),
        "--set",
        "train.steps=96",
        "--set",
        "train.checkpoint_every=8",
        "--set",
        "train.log_every=8",
    ]
    # This launch's workers are new Pythons (as on a system without fork); the relaunch's are
    # forked from the launcher after its import (launch.py's default on Linux).
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "AMPTRAIN_FORK": "0"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "amptrain", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        # "launching 2 workers on localhost ports ...", then "[launch] workers 0: pid P, 1: pid Q (...)".
        started = launcher.stdout.readline() + launcher.stdout.readline()
        assert "(each a new Python)" in started, started + launcher.stdout.read()
        pids = dict(re.findall(r"(\d+): pid (\d+)", started.splitlines()[-1]))
        assert sorted(map(int, pids.values())) == sorted(_children(launcher.pid)), started
        metrics = run_dir / "metrics.jsonl"
        deadline = time.time() + 300
        while not any(r.get("kind") == "train" and r["step"] >= 16 for r in read_metrics(metrics)):
            assert time.time() < deadline and launcher.poll() is None, "the run did not get to step 16"
            time.sleep(0.5)
        assert '"index": 1' in _environ(int(pids["1"]))["TF_CONFIG"]  # the pid printed is worker 1's
        os.kill(int(pids["1"]), signal.SIGKILL)
        killed = time.time()
        output, _ = launcher.communicate(timeout=120)
        output = started + output
        # The launcher ends when worker 0 does: it stopped by itself, it was not stopped for it.
        assert time.time() - killed < 60
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert "[worker 0] amptrain: training stopped: worker 0" in output and "lost worker 1 (localhost:" in output, (
        output[-3000:]
    )
    assert "[launch] stopping the remaining workers" not in output
    last_checkpoint = int(tf.train.latest_checkpoint(run_dir / "checkpoints").rsplit("-", 1)[1])

    again = amptrain_cli(args)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "(forked after the import)" in again.stdout.splitlines()[1], again.stdout[:500]
    records = read_metrics(run_dir / "metrics.jsonl")
    runs = [r for r in records if r["kind"] == "run"]
    assert runs[-1]["resumed_from_step"] == last_checkpoint >= 16
    assert records[-1] == {"kind": "end", "step": 96}
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 96  # no step logged twice


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def _environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.decode(errors="replace").split("=", 1) for item in f.read().split(b"\0") if b"=" in item)
