"""Where a training step's op time goes, by TensorFlow op type, for each precision variant
at the bf16 issue's seed shape (benchmarks/bf16_vs_peer.py's SHAPE: 4 layers, hidden 256,
4 heads, FFN 1024, sequence 128, batch 32, vocabulary 8000, one batch from memory).

    .venv/bin/python benchmarks/bf16_step_ops.py [--variants float32,mixed_bfloat16] [--calls 3]
        [--steps 8] [--dropout 0.1] [--top 18] [--set KEY=VALUE]...

Each variant's trainer is built and warmed up in this one process (the engine's path, as
bf16_vs_peer.py times it), then `--calls` graph calls of `--steps` steps are traced with
the TensorFlow profiler. The trace's op events on the compute threads are summed by op
type (the part of the op name after the last ':'; XLA clusters show as one
`_XlaRun`/cluster op) and printed as ms a step and share of the variant's op time, the
variants side by side. Op time on two threads adds up to more than the wall time, which
is printed beside it (`wall ms a step`).
"""

import argparse
import collections
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "src"))


def op_times(logdir):
    """{op type: picoseconds} over the compute threads of the trace in `logdir`."""
    from amptrain.engine.profiling import host_events

    totals = collections.Counter()
    for thread, name, picoseconds in host_events(logdir):
        compute = thread.startswith("tf_Compute") or "Eigen" in thread
        if compute and ":" in name and not name.startswith("ExecutorState"):
            totals[name.rsplit(":", 1)[1]] += picoseconds
    return totals


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="float32,mixed_bfloat16")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--set", action="append", default=[], help="a config override KEY=VALUE for every variant")
    args = parser.parse_args()

    import tensorflow as tf
    from bf16_vs_peer import build_amptrain

    names = args.variants.split(",")
    runs = build_amptrain(names, args.dropout, args.steps, args.set)
    tables, walls = {}, {}
    for name in names:
        runs[name](args.steps)
        logdir = tempfile.mkdtemp(prefix="amptrain-ops-")
        tf.profiler.experimental.start(logdir)
        started = time.perf_counter()
        for _ in range(args.calls):
            runs[name](args.steps)
        walls[name] = (time.perf_counter() - started) * 1e3 / (args.calls * args.steps)
        tf.profiler.experimental.stop()
        tables[name] = op_times(logdir)
    steps = args.calls * args.steps
    every = collections.Counter()
    for table in tables.values():
        every.update(table)
    print(f"ms a step (share of the variant's op time); {steps} steps each, dropout {args.dropout}")
    print(f"{'op type':28s}" + "".join(f"{name:>26s}" for name in names))
    for op, _ in every.most_common(args.top):
        cells = []
        for name in names:
            total = sum(tables[name].values())
            ps = tables[name].get(op, 0)
            cells.append(f"{ps / 1e9 / steps:14.1f} ({ps / total:6.1%})")
        print(f"{op:28s}" + "".join(f"{c:>26s}" for c in cells))
    print(f"{'all ops':28s}" + "".join(f"{sum(tables[n].values()) / 1e9 / steps:14.1f} {'':9s}" for n in names))
    print(f"{'wall ms a step':28s}" + "".join(f"{walls[n]:14.1f} {'':9s}" for n in names))


if __name__ == "__main__":
    main()
