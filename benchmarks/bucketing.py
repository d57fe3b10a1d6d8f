"""What length bucketing buys: the same encoder classifier on the English side of the
en-es training pairs at `max_length` 64, with `data.bucketing` on and off (off: every
batch padded to 64), alternated A/B in separate processes, each timed by the bench worker.

    .venv/bin/python benchmarks/bucketing.py [--rounds 5] [--steps 60] [--set KEY=VALUE]...

The label (does the verse name God or the LORD, about 21% of verses) only gives the
classifier something real to learn; the measurement is speed. Last line:
`ratio R (ideal I, min …, max …, rounds N)`: R is real tokens/s with bucketing over
without, I is padded over real tokens of the padded pipeline, the most bucketing can gain.
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


def main():
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from amptrain.bench.runner import run_worker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "english.csv")
        write_english_csv(data)
        base = [f"data.train={data}", 'data.dev=""', 'data.test=""', "data.max_length=64", "data.vocabulary_size=4000",
                "runtime.jit_compile=true", "runtime.steps_per_execution=4", *args.set]
        results = {True: [], False: []}
        for round_ in range(args.rounds):
            for bucketing in (True, False) if round_ % 2 == 0 else (False, True):
                spec = {"kind": "combination", "config": CONFIG, "overrides": [*base, f"data.bucketing={str(bucketing).lower()}"],
                        "steps": args.steps, "repeats": 1, "data": "real"}
                results[bucketing].append(run_worker(spec))
            on, off = results[True][-1], results[False][-1]
            print(f"round {round_ + 1}: bucketing on {on['real_tokens_per_second']:,.0f}, "
                  f"off {off['real_tokens_per_second']:,.0f} real tokens/s", flush=True)
    ratios = [a["real_tokens_per_second"] / b["real_tokens_per_second"] for a, b in zip(results[True], results[False])]
    ideal = statistics.median(b["padded_tokens"] / b["real_tokens"] for b in results[False])
    padding_on = statistics.median(a["padded_tokens"] / a["real_tokens"] for a in results[True])
    print(f"padded/real tokens: bucketing off {ideal:.2f}, on {padding_on:.2f}")
    print(f"ratio {statistics.median(ratios):.2f} (ideal {ideal:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}, rounds {len(ratios)})")


if __name__ == "__main__":
    main()
