"""What length bucketing buys: the same encoder classifier on the English side of the
en-es training pairs at `max_length` 64, with `data.bucketing` on and off (off: every
batch padded to 64), alternated A/B in separate processes, each timed by the bench worker.

    .venv/bin/python benchmarks/bucketing.py [--rounds 5] [--steps 60] [--num-buckets 6,8] [--unfused] \
        [--set KEY=VALUE]...

The label (does the verse name God or the LORD, about 21% of verses) only gives the
classifier something real to learn; the measurement is speed. Last line:
`ratio R (ideal I, min …, max …, rounds N)`: R is real tokens/s with bucketing over
without, I is padded over real tokens of the padded pipeline, the most bucketing can gain.
`--unfused` keeps the optimizer update out of XLA (`Trainer(fuse_step=False)`, the
engine's one-device path before the fused step), for comparison.
"""

import argparse
import csv
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIRS = os.path.join(ROOT, "data", "translate-en-es", "train.tsv")
CONFIG = os.path.join(ROOT, "configs", "classify-spam.toml")


def write_english_csv(path):
    with open(PAIRS, encoding="utf-8") as source, open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["text", "label"])
        for line in source:
            english = line.split("\t", 1)[0]
            writer.writerow([english, "god" if ("God" in english or "LORD" in english) else "other"])


def base_overrides(data):
    """The settings both sides share (and `step_profile.py`)."""
    return [
        f"data.train={data}",
        'data.dev=""',
        'data.test=""',
        "data.max_length=64",
        "data.vocabulary_size=4000",
        "runtime.jit_compile=true",
        "runtime.steps_per_execution=4",
    ]


def main():
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from amptrain.bench.runner import run_worker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--unfused", action="store_true", help="only the forward and backward pass under XLA")
    parser.add_argument(
        "--num-buckets",
        default="",
        help="comma-separated data.num_buckets to try, each against "
        "the same unbucketed runs (default: the config's); the last line is the first's",
    )
    args = parser.parse_args()
    variants = [int(n) for n in args.num_buckets.split(",") if n.strip()] or [None]
    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "english.csv")
        write_english_csv(data)
        base = [*base_overrides(data), *args.set]
        sides = ["off", *variants]
        results = {side: [] for side in sides}
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else reversed(sides):  # A B C / C B A / ...
                bucketing = [f"data.bucketing={str(side != 'off').lower()}"]
                if side not in ("off", None):
                    bucketing.append(f"data.num_buckets={side}")
                spec = {
                    "kind": "combination",
                    "config": CONFIG,
                    "overrides": [*base, *bucketing],
                    "steps": args.steps,
                    "repeats": 1,
                    "data": "real",
                    "fuse_step": not args.unfused,
                }
                results[side].append(run_worker(spec))
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{_name(side)} {results[side][-1]['real_tokens_per_second']:,.0f}" for side in sides)
                + " real tokens/s",
                flush=True,
            )
    off = results["off"]
    ideal = statistics.median(b["padded_tokens"] / b["real_tokens"] for b in off)
    lines = []
    for side in variants:
        on = results[side]
        ratios = [a["real_tokens_per_second"] / b["real_tokens_per_second"] for a, b in zip(on, off)]
        padding_on = statistics.median(a["padded_tokens"] / a["real_tokens"] for a in on)
        ratio = statistics.median(ratios)
        print(
            f"{_name(side)}: padded/real tokens {padding_on:.2f} (off {ideal:.2f}); step time p50 "
            f"{statistics.median(a['step_time_p50'] for a in on) * 1e3:.1f} ms (off "
            f"{statistics.median(b['step_time_p50'] for b in off) * 1e3:.1f} ms); "
            f"(R - 1) / (I - 1) = {(ratio - 1) / (ideal - 1):.0%}"
        )
        lines.append(
            f"ratio {ratio:.2f} (ideal {ideal:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}, rounds {len(ratios)})"
        )
    for side, line in list(zip(variants, lines))[1:]:
        print(f"{_name(side)}: {line}")
    print(lines[0])


def _name(side):
    return {"off": "bucketing off", None: "bucketing on"}.get(side, f"{side} buckets")


if __name__ == "__main__":
    main()
