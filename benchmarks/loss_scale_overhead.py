"""What the loss scaler and its in-graph telemetry cost: the same float32 run with
`precision.loss_scale = "dynamic"` (forced on) and `"none"`, alternated A/B for several
rounds in one process, each run's compile excluded.

    .venv/bin/python benchmarks/loss_scale_overhead.py [CONFIG] [--rounds 5] [--steps 60]

Prints the median step time of each and, as its last line,
`ratio R (min …, max …, rounds N)`: scaler-on step time over scaler-off (1.00 = free).
"""

import argparse
import statistics
import tempfile

import amptrain
from amptrain.engine.run_log import read_metrics


def step_time(config, mode, steps, log_every, run_dir):
    """Seconds a step over the windows after the first (which holds the compile)."""
    overrides = {
        "precision.policy": "float32",
        "precision.loss_scale": mode,
        "train.steps": steps,
        "train.log_every": log_every,
        "train.eval_every": steps,
        "train.checkpoint_every": steps,
    }
    amptrain.fit(config, overrides, run_dir=run_dir, overwrite=True)
    train = [r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["kind"] == "train"]
    times = [b["wall_time"] - a["wall_time"] for a, b in zip(train[1:], train[2:])]
    return statistics.median(times) / log_every


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/classify-spam.toml")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    results = {"none": [], "dynamic": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            order = ("none", "dynamic") if round_ % 2 == 0 else ("dynamic", "none")
            for mode in order:
                results[mode].append(step_time(args.config, mode, args.steps, args.log_every, f"{scratch}/{mode}"))
            print(
                f"round {round_ + 1}: off {results['none'][-1] * 1e3:.1f} ms, "
                f"on {results['dynamic'][-1] * 1e3:.1f} ms a step"
            )
    ratios = [on / off for on, off in zip(results["dynamic"], results["none"])]
    print(
        f"median step time: scaler off {statistics.median(results['none']) * 1e3:.1f} ms, "
        f"on {statistics.median(results['dynamic']) * 1e3:.1f} ms"
    )
    print(f"ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, rounds {len(ratios)})")


if __name__ == "__main__":
    main()
