"""Load on `amptrain serve`: N concurrent clients on the loopback interface against the
server, beside the in-process SavedModel call (the limit) and the ONNX export under
onnxruntime, for a classifier run, at 1 and 32 texts a request.

    .venv/bin/python benchmarks/serve_load.py runs/classify-spam [--clients 8] [--requests 300] [--seconds 15]

The run is exported (a SavedModel and ONNX, into a temporary folder), `amptrain serve` is
started on 127.0.0.1 on a free port (cross-request batching: --max-batch-size 32,
--batch-wait-ms 2, as set here), and each variant is timed round after round in turn (so
that a load that comes and goes on a shared machine falls on all alike):

- `in-process SavedModel`: one caller, `serving_default` on the batch's texts;
- `ONNX ids (onnxruntime)`: one caller, the token-ids model on the same texts' ids,
  tokenized beforehand (not timed), as benchmarks/serving.py does;
- `serve, C clients`: C threads, each with one keep-alive HTTP connection, sending
  `{"instances": [batch texts]}` and reading the JSON answer, C = 1 and --clients.

A variant stops at --requests requests or --seconds a round, whichever comes first.
Latencies are per request (per call in-process), pooled over the rounds; texts/s is the
median over rounds. Prints the table, the CPU and /proc/loadavg at the start and end.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import numpy as np

BATCHES = (1, 32)


def in_process(export_dir, onnx_path, task, texts):
    """{name: call(batch)} of the in-process variants."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    from serving import padded_ids  # benchmarks/serving.py: the token ids its ids variants take

    from amptrain.serving.onnx import onnx_session

    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    session = onnx_session(onnx_path)
    ids = padded_ids(task, texts, BATCHES)
    return {
        "in-process SavedModel": lambda batch: serve(text=tf.constant(batch)),
        "ONNX ids (onnxruntime)": lambda batch: session.run(None, {"token_ids": ids[len(batch)]}),
    }


def start_server(export_dir, log_path):
    command = [sys.executable, "-m", "amptrain", "serve", export_dir, "--port", "0", "--name", "bench"]
    command += ["--max-batch-size", "32", "--batch-wait-ms", "2", "--poll-seconds", "0"]
    log = open(log_path, "w")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    )
    deadline = time.monotonic() + 300
    while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/", open(log_path).read())):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"amptrain serve did not start:\n{open(log_path).read()[-3000:]}")
        time.sleep(0.2)
    return process, int(found.group(1))


def time_in_process(call, work, limit, seconds):
    latencies, started = [], time.perf_counter()
    for batch in work[:limit]:
        t = time.perf_counter()
        call(batch)
        latencies.append(time.perf_counter() - t)
        if time.perf_counter() - started > seconds:
            break
    return latencies, sum(map(len, work[: len(latencies)])) / (time.perf_counter() - started)


def time_clients(port, clients, work, limit, seconds):
    """C threads, each its own keep-alive connection, sharing `limit` requests."""
    latencies, lock, next_index = [], threading.Lock(), iter(range(limit))
    stop_at = time.perf_counter() + seconds
    texts_done = [0]

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.perf_counter() < stop_at:
            with lock:
                i = next(next_index, None)
            if i is None:
                break
            body = json.dumps({"instances": work[i % len(work)]})
            t = time.perf_counter()
            connection.request("POST", "/v1/models/bench:predict", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200 and len(answer["predictions"]) == len(work[i % len(work)]), answer
            with lock:
                latencies.append(time.perf_counter() - t)
                texts_done[0] += len(work[i % len(work)])
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, texts_done[0] / (time.perf_counter() - started)


def load_texts(run_dir):
    from amptrain.exports.loading import load_config
    from amptrain.tasks import create_task

    task = create_task(load_config(run_dir), run_dir)
    task.prepare(("test",))
    return task, [e.text for e in task.splits["test"].examples]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a trained classification run")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300, help="requests (calls) a variant and round at most")
    parser.add_argument("--seconds", type=float, default=15, help="seconds a variant and round at most")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from amptrain import api
    from amptrain.precision.policy import cpu_flags_from_proc, cpu_model_name

    task, texts = load_texts(args.run_dir)
    load_start = open("/proc/loadavg").read().split()[:3]
    with tempfile.TemporaryDirectory(prefix="amptrain-serve-load-") as out:
        saved = api.export(args.run_dir, out=os.path.join(out, "export"))["path"]
        onnx = api.export(args.run_dir, out=os.path.join(out, "onnx"), fmt="onnx")["path"]
        calls = in_process(saved, os.path.join(onnx, "model.onnx"), task, texts)
        process, port = start_server(os.path.join(out, "export"), os.path.join(out, "serve.log"))
        try:
            results = run_rounds(args, calls, port, texts)
        finally:
            process.terminate()
            process.wait(timeout=60)
    flags = sorted(cpu_flags_from_proc() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    print(f"\nCPU: {cpu_model_name()} ({os.cpu_count()} cores), flags {flags or 'none'}")
    print(f"load average at start {load_start}, at end {open('/proc/loadavg').read().split()[:3]}")
    report(results)


def run_rounds(args, calls, port, texts):
    variants = [*calls, "serve, 1 client", f"serve, {args.clients} clients"]
    work = {b: [[texts[(i * b + j) % len(texts)] for j in range(b)] for i in range(args.requests)] for b in BATCHES}
    results = {(v, b): ([], []) for v in variants for b in BATCHES}
    for round_ in range(args.rounds + 1):  # round 0 warms up: traces, first allocations, connections
        for batch in BATCHES:
            for name, call in calls.items():
                measured = time_in_process(call, work[batch], args.requests, args.seconds)
                _keep(results[name, batch], measured, round_)
            for clients in (1, args.clients):
                measured = time_clients(port, clients, work[batch], args.requests, args.seconds)
                _keep(results[variants[2 if clients == 1 else 3], batch], measured, round_)
        print(f"round {round_}/{args.rounds} done, load {open('/proc/loadavg').read().split()[:3]}", flush=True)
    return results


def _keep(slot, measured, round_):
    if round_ > 0:
        slot[0].extend(measured[0])
        slot[1].append(measured[1])


def report(results):
    print("\n| variant | texts a request | p50 ms | p99 ms | texts/s | requests timed |\n|---|---|---|---|---|---|")
    for (name, batch), (latencies, rates) in results.items():
        p50, p99 = (np.percentile(latencies, q) * 1000 for q in (50, 99))
        print(f"| {name} | {batch} | {p50:.2f} | {p99:.2f} | {statistics.median(rates):.0f} | {len(latencies)} |")
    for batch in BATCHES:
        base = np.percentile(results["in-process SavedModel", batch][0], 50)
        one = np.percentile(results["serve, 1 client", batch][0], 50)
        rate = statistics.median(results["in-process SavedModel", batch][1])
        many = max(statistics.median(v[1]) for (n, b), v in results.items() if b == batch and n.startswith("serve"))
        print(
            f"batch {batch}: serve p50 / in-process p50 = {one / base:.2f}x; in-process texts/s / best serve = "
            f"{rate / many:.2f}x"
        )


if __name__ == "__main__":
    main()
