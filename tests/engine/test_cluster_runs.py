"""Workers from a scheduler's variables, for real: a SLURM step of 2 tasks and a Kubernetes
Indexed Job of 2 pods, each faked on localhost by the variables the scheduler would set (no
SLURM or Kubernetes here), train the tiny config to the same final weights, bit for bit, as
`amptrain launch --workers 2`; each worker builds only its half of every batch."""

import re
import socket

import forked_cli
import pytest
from conftest import write_tiny

from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow

SETS = ["runtime.deterministic=true", "precision.policy=float32", "runtime.jit_compile=false", "train.steps=4"]
SETS += ["train.eval_every=2", "train.checkpoint_every=2", "runtime.steps_per_execution=2", "model.dropout=0.0"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, spam_rows):
    return write_tiny(tmp_path_factory.mktemp("clusters"), spam_rows)


def two_free_ports_in_a_row():
    """A base port whose next one is free too (the scheduler variables give base + local rank)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("localhost", 0))
            base = first.getsockname()[1]
            try:
                with socket.socket() as second:
                    second.bind(("localhost", base + 1))
                    return base
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def fit(tiny, run_dir, environments):
    """`amptrain fit` once an environment, all at once; returns each one's output."""
    sets = sum((["--set", s] for s in SETS), [])
    workers = [
        forked_cli.start(["fit", str(tiny / "tiny.toml"), "--run-dir", str(run_dir), *sets], env=env)
        for env in environments
    ]
    results = [worker.finish(600) for worker in workers]
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return [result.stdout + result.stderr for result in results]


def fingerprint(output):
    (found,) = set(re.findall(r"final weights (\w+)", output))
    return found


def test_a_worker_that_never_starts_is_named_at_the_startup_deadline(tiny):
    import json
    import time

    base = two_free_ports_in_a_row()
    cluster = {"worker": [f"localhost:{base}", f"localhost:{base + 1}"]}  # worker 1 is never started
    env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})}
    started = time.monotonic()
    args = ["fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "alone"), "--set", "runtime.startup_timeout=5"]
    result = forked_cli.start(args, env=env).finish(120)
    assert result.returncode != 0 and time.monotonic() - started < 100
    assert f"never arrived: worker 1 (localhost:{base + 1})" in result.stderr


@pytest.fixture(scope="module")
def launched(tiny):
    """The reference: `amptrain launch --workers 2` (TF_CONFIG on localhost)."""
    sets = sum((["--set", s] for s in SETS), [])
    result = forked_cli.run(
        ["launch", "--workers", "2", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "launch"), *sets]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    hashes = set(re.findall(r"final weights (\w+)", result.stdout + result.stderr))
    assert len(hashes) == 1
    return hashes.pop()


def test_a_slurm_step_of_two_tasks_trains_as_launch_does(tiny, launched):
    base = two_free_ports_in_a_row()
    step = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NODELIST": "localhost"}
    step.update({"SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2", "AMPTRAIN_PORT": str(base)})
    outputs = fit(tiny, tiny / "slurm", [{**step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in (0, 1)])
    assert [fingerprint(o) for o in outputs] == [launched, launched]
    run = next(r for r in read_metrics(tiny / "slurm" / "metrics.jsonl") if r["kind"] == "run")
    assert (run["num_workers"], run["cluster"], run["input_share"]) == (2, "SLURM", [0, 2])
    assert f"worker 1 (localhost:{base + 1}): builds part 2 of 2 of each global batch's rows" in outputs[1]


def test_a_slurm_step_of_one_task_is_one_device(tiny):
    one = {"SLURM_JOB_ID": "78", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "localhost"}
    fit(tiny, tiny / "slurm-one", [{**one, "SLURM_TASKS_PER_NODE": "1"}])
    run = next(r for r in read_metrics(tiny / "slurm-one" / "metrics.jsonl") if r["kind"] == "run")
    assert (run["strategy"], run["num_workers"], run["cluster"], run["input_share"]) == ("one_device", 1, None, None)


def test_an_indexed_jobs_two_pods_train_as_launch_does(tiny, launched):
    base = two_free_ports_in_a_row()
    pod = {"AMPTRAIN_WORKERS": "2", "AMPTRAIN_WORKER_ADDRESS": "localhost:{port}", "AMPTRAIN_PORT": str(base)}
    outputs = fit(tiny, tiny / "kubernetes", [{**pod, "JOB_COMPLETION_INDEX": str(i)} for i in (0, 1)])
    assert [fingerprint(o) for o in outputs] == [launched, launched]
    run = next(r for r in read_metrics(tiny / "kubernetes" / "metrics.jsonl") if r["kind"] == "run")
    assert (run["cluster"], run["input_share"]) == ("Kubernetes", [0, 2])
