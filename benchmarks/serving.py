"""Serving speed of a trained run: `amptrain predict` in-process against its exports, at
batch 1 and batch 32, on this CPU; medians of several rounds in one run.

    .venv/bin/python benchmarks/serving.py runs/classify-spam [--rounds 7] [--calls 10]

Variants (each loaded and warmed up once, then timed round after round in turn, so that a
load that comes and goes on a shared machine falls on all alike):

- `predict in-process`: the run's model as `amptrain predict` runs it (`api.load_run`
  once, then `task.predict_texts`: tokenizing in Python, bucketed batches, the Trainer's
  predict function), model loading excluded;
- `SavedModel text`: the float32 export's `serving_default` (raw strings in, tokenizing
  in the graph), loaded with `tf.saved_model.load`; `SavedModel bf16 text`: the same,
  exported with `--precision bfloat16`;
- `SavedModel ids` and `ONNX ids (onnxruntime)`: the token-ids signature and its ONNX
  model on the same padded ids (tokenized beforehand, not timed): classification only.

Texts: the run's test split (its first 32), cycled at batch 1. Prints the export sizes,
then a row a variant and batch: the median ms a call, texts/s, and the slowest round's ms,
with the CPU model, its bf16 flags and /proc/loadavg at the start and end.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import numpy as np

BATCHES = (1, 32)


def variants(run_dir, out_dir, texts):
    """{name: call(batch of texts)} and the export sizes {name: bytes}."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from amptrain import api

    task, model, predict_fn, _ = api.load_run(run_dir, ())
    found = {"predict in-process": lambda batch: task.predict_texts(batch, model, predict_fn)}
    sizes = {}
    for name, options in (("SavedModel", {}), ("SavedModel bf16", {"precision": "bfloat16"})):
        result = api.export(run_dir, out=out_dir, version=len(sizes) + 1, **options)
        sizes[name] = result["bytes"]
        serve = tf.saved_model.load(result["path"]).signatures["serving_default"]
        found[f"{name} text"] = lambda batch, serve=serve: serve(text=tf.constant(batch))
        if name == "SavedModel":
            by_ids = tf.saved_model.load(result["path"]).signatures["serve_token_ids"]
    if task.config.task == "classification":
        onnx = api.export(run_dir, out=out_dir, version=9, fmt="onnx")
        sizes["ONNX"] = onnx["bytes"]
        from amptrain.serving.onnx import onnx_session

        session = onnx_session(os.path.join(onnx["path"], "model.onnx"))
        ids = padded_ids(task, texts, BATCHES)
        found["SavedModel ids"] = lambda batch: by_ids(token_ids=tf.constant(ids[len(batch)]))
        found["ONNX ids (onnxruntime)"] = lambda batch: session.run(None, {"token_ids": ids[len(batch)]})
    return found, sizes


def padded_ids(task, texts, batches):
    """{batch size: (batch, length) int32}: the first texts' token ids, cut to max_length and
    padded, as the token-ids signatures (SavedModel and ONNX) take them."""
    from amptrain.data.vocabulary import PAD_ID

    ids = {}
    for batch in batches:
        pieces = [p[: task.config.data.max_length] for p in task.encode_texts(texts[:batch])]
        padded = np.full((batch, max(map(len, pieces))), PAD_ID, np.int32)
        for row, p in enumerate(pieces):
            padded[row, : len(p)] = p
        ids[batch] = padded
    return ids


def example_text(example):
    """The raw text of a test example: a classification text, a NER sentence's words, a translation source."""
    if hasattr(example, "words"):
        return " ".join(example.words)
    return example.text if hasattr(example, "text") else example.source


def time_calls(call, batches):
    started = time.perf_counter()
    for batch in batches:
        call(batch)
    return (time.perf_counter() - started) / len(batches) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="timed calls a round, variant and batch size")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from amptrain.exports.loading import load_config
    from amptrain.precision.policy import cpu_flags_from_proc, cpu_model_name
    from amptrain.tasks import create_task

    config = load_config(args.run_dir)
    task = create_task(config, args.run_dir)
    task.prepare(("test",))
    texts = [
        getattr(e, "text", None) or " ".join(getattr(e, "words", ())) or e.source for e in task.splits["test"].examples
    ]
    texts = texts[: max(BATCHES)]
    load_start = open("/proc/loadavg").read().split()[:3]
    with tempfile.TemporaryDirectory(prefix="amptrain-serving-") as out_dir:
        found, sizes = variants(args.run_dir, out_dir, texts)
        work = {b: [[texts[(i + j) % len(texts)] for j in range(b)] for i in range(args.calls)] for b in BATCHES}
        for call in found.values():  # warm-up: traces, compiles, first allocations
            for batch in BATCHES:
                time_calls(call, work[batch][:2])
        times = {(name, b): [] for name in found for b in BATCHES}
        for round_ in range(args.rounds):
            for name, call in found.items():
                for batch in BATCHES:
                    times[name, batch].append(time_calls(call, work[batch]))
            print(f"round {round_ + 1}/{args.rounds} done, load {open('/proc/loadavg').read().split()[:3]}", flush=True)
    flags = sorted(cpu_flags_from_proc() & {"amx_bf16", "avx512_bf16"})
    print(f"\nCPU: {cpu_model_name()} ({os.cpu_count()} cores), bf16 flags {flags or 'none'}")
    print(f"load average at start {load_start}, at end {open('/proc/loadavg').read().split()[:3]}")
    print("export sizes: " + ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in sizes.items()))
    print("\n| variant | batch | median ms a call | texts/s | slowest round ms |\n|---|---|---|---|---|")
    for (name, batch), values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {batch} | {median:.2f} | {batch / median * 1000:.0f} | {max(values):.2f} |")


if __name__ == "__main__":
    main()
