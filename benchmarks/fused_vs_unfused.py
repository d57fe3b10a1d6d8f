"""Fused against unfused step time at a few padded lengths, in one process, interleaved,
printing each round as it goes (a crash loses nothing).

    .venv/bin/python -u benchmarks/fused_vs_unfused.py LENGTHS ROUNDS CALLS
    .venv/bin/python -u benchmarks/fused_vs_unfused.py 16,32,64 4 8

The model, data and settings of `benchmarks/bucketing.py` (4 steps a graph call). For each
length a real batch of that shape is served from memory to two trainers built alike: the
fused step (`Trainer.fused`: the whole step one XLA cluster) and `fuse_step=False` (only
the forward and backward pass under XLA). Both compile every shape first; then each round
times CALLS graph calls a shape and side. The last lines give the median ms a step and the
per-round difference unfused - fused.
"""

import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "src"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
from bucketing import CONFIG, base_overrides, write_english_csv
from step_profile import shape_batches

from amptrain import config as config_lib
from amptrain.bench.worker import build_trainer

lengths = [int(n) for n in sys.argv[1].split(",")]
rounds, calls = int(sys.argv[2]), int(sys.argv[3])
with tempfile.TemporaryDirectory() as scratch:
    data = os.path.join(scratch, "english.csv")
    write_english_csv(data)
    config = config_lib.load_config(CONFIG, [*base_overrides(data), "data.bucketing=true"])
    task, _, fused, _ = build_trainer(config)
_, _, unfused, _ = build_trainer(config, task=task, fuse_step=False)
assert fused.fused and not unfused.fused
spe = config.runtime.steps_per_execution
batches = shape_batches(task, lengths, config.train.batch_size)
its = {(s, n): iter(tf.data.Dataset.from_tensors(b).repeat()) for s in ("fused", "unfused") for n, b in batches.items()}
sides = {"fused": fused, "unfused": unfused}
for (s, _), it in its.items():
    sides[s].train(it, spe)
    sides[s].train(it, spe)
print("compiled", flush=True)
ms = {k: [] for k in its}
for r in range(rounds):
    for n in lengths:
        for s in ("fused", "unfused") if r % 2 == 0 else ("unfused", "fused"):
            t0 = time.perf_counter()
            for _ in range(calls):
                sides[s].train(its[(s, n)], spe)
            ms[(s, n)].append((time.perf_counter() - t0) * 1e3 / (calls * spe))
    print(f"round {r + 1}: " + ", ".join(f"{s} {n}: {ms[(s, n)][-1]:.2f}" for s, n in its), flush=True)
for n in lengths:
    f, u = ms[("fused", n)], ms[("unfused", n)]
    diffs = [b - a for a, b in zip(f, u)]
    print(
        f"length {n}: fused median {statistics.median(f):.2f} ms (min {min(f):.2f}), "
        f"unfused {statistics.median(u):.2f} "
        f"(min {min(u):.2f}); unfused - fused per round: median {statistics.median(diffs):.2f} ms "
        f"(min {min(diffs):.2f}, max {max(diffs):.2f})",
        flush=True,
    )
