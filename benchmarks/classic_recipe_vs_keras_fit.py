"""The classic recipe under Keras `model.fit` against `amptrain.Trainer`.

    .venv/bin/python benchmarks/classic_recipe_vs_keras_fit.py [--rounds 5] [--steps 200] [--jit auto]

Both sides train examples/classic_recipe's model (CustomAttention pinned to float32,
`mixed_float16`, 50 steps per execution, batch 32, Adam at a constant 1e-3, one device) on
the bundled spam mails, with the example's own functions: (a) Keras: `keras_recipe()` (the
model, the LossScaleOptimizer and `compile` of the example's `--keras-fit`) and `fit` on the
arrays with the example's batch size, which shuffles them each epoch; (b) amptrain: the
example's `trainer(...)` and `fit()`, its settings as they are but for `train.steps` and
`runtime.jit_compile` (`--jit`; "auto", the example's, lets the precision probe choose, once,
into a cache of this benchmark's own: the probe is not timed).

Timed: training alone. Evaluation and checkpoints are left out of the window on both sides:
Keras trains without `validation_data` and `ModelCheckpoint` (and without its progress bar,
`verbose=0`: the lightest fit); amptrain evaluates and checkpoints once, after its last step.
Each side's clock reads at the end of its graph calls (a Keras callback after each
`steps_per_execution` call, reading the loss; amptrain's `train` records of metrics.jsonl,
one each 50 steps, `train.log_every`). The window starts at the first call ending at or
past the warm-up (one epoch and one call more: tracing, compiling, the first epoch's short
last batch, a new epoch's iterator) and ends at the first call ending `--steps` steps later.

Both sides compute every step on 32 x 128 padded token ids, so the measure is examples a
second (the window's real rows: 32 a step but 6 in each epoch's last); the two sides shuffle
differently, so their windows hold other mails, and real tokens/s is derived: examples/s
times the mean real tokens of a training mail (exact over whole epochs).

Each measurement is a process of its own, alternated keras/amptrain/amptrain/keras/... for
`rounds` rounds. The last line is the ratio of examples/s, amptrain over Keras fit:
`ratio 1.03 (min 0.97, max 1.08, rounds 5)`.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "classic_recipe")


def cpu():
    """(model name, {flag: present} for the bf16 and fp16 flags) from /proc/cpuinfo."""
    name, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, {flag: flag in flags for flag in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")}


# === The window ===


def rows_of_step(step, examples, batch_size):
    """Real rows of step `step` (1-based): a full batch, but the epoch's last holds the rest."""
    index = (step - 1) % math.ceil(examples / batch_size)
    full = examples // batch_size
    return batch_size if index < full else examples - full * batch_size


def window(ends, warmup, steps):
    """(first step, last step, seconds) from [(step, time)] at the end of each graph call:
    from the first call ending at or past `warmup` to the first ending `steps` later."""
    start = next((s, t) for s, t in ends if s >= warmup)
    end = next(((s, t) for s, t in ends if s >= start[0] + steps), None)
    if end is None:
        raise SystemExit(f"classic_recipe_vs_keras_fit.py: training ended at step {ends[-1][0]}, before the window")
    return start[0], end[0], end[1] - start[1]


def warmup_steps(examples, batch_size, steps_per_execution):
    """One epoch and one call more, in whole calls of `steps_per_execution`."""
    epoch = math.ceil(examples / batch_size)
    return (epoch // steps_per_execution + 1) * steps_per_execution


# === The two sides (each in a process of its own) ===


def measure_keras(recipe, data, warmup, steps):
    import keras

    class CallEnds(keras.callbacks.Callback):
        """(step, time) at the end of each graph call; stops when the window is covered."""

        def __init__(self, steps_per_epoch):
            super().__init__()
            self.steps_per_epoch, self.epoch, self.ends = steps_per_epoch, 0, []

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # the call's outputs read: it has finished
            # `batch` is the call's last step as planned: an epoch's last call runs fewer
            step = self.epoch * self.steps_per_epoch + min(batch + 1, self.steps_per_epoch)
            self.ends.append((step, time.perf_counter()))
            started = [s for s, _ in self.ends if s >= warmup]
            if started and step >= started[0] + steps:
                self.model.stop_training = True

    batch_size = recipe.CONFIG["train.batch_size"]
    x, y = data["train"]
    model = recipe.keras_recipe()
    ends = CallEnds(math.ceil(len(y) / batch_size))
    model.fit(x, y, batch_size=batch_size, epochs=10**6, callbacks=[ends], verbose=0)
    keras.mixed_precision.set_global_policy("float32")
    return ends.ends, {"policy": "mixed_float16", "jit_compile": model.jit_compile}


def measure_amptrain(recipe, data, warmup, steps, run_dir, jit):
    from amptrain.engine.run_log import read_metrics

    log_every = recipe.CONFIG["train.log_every"]  # a train record each `log_every` steps: the clock
    total = math.ceil(warmup / log_every) * log_every + math.ceil(steps / log_every) * log_every
    settings = {"train.steps": total, "train.eval_every": total, "train.checkpoint_every": total}
    if jit != "auto":
        settings["runtime.jit_compile"] = {"on": True, "off": False}.get(jit, jit)
    recipe.trainer(data, run_dir, settings.items(), overwrite=True).fit()
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    run = next(r for r in records if r["kind"] == "run")
    choice = run.get("precision_choice") or {}
    ends = [(r["step"], r["wall_time"]) for r in records if r["kind"] == "train"]
    return ends, {"policy": run["policy"], "jit_compile": run["jit_compile"], "choice": choice.get("source")}


def child(args):
    sys.path.insert(0, EXAMPLE)
    import classic_recipe as recipe
    import numpy as np

    import amptrain

    amptrain.configure_devices(recipe.CONFIG)  # as the example's main, on both sides
    data = recipe.load_spam()
    ids = data["train"][0]["token_ids"]
    examples, batch_size = len(ids), recipe.CONFIG["train.batch_size"]
    warmup = warmup_steps(examples, batch_size, recipe.CONFIG["runtime.steps_per_execution"])
    if args.child == "keras":
        ends, how = measure_keras(recipe, data, warmup, args.steps)
    else:
        ends, how = measure_amptrain(recipe, data, warmup, args.steps, args.run_dir, args.jit)
    first, last, seconds = window(ends, warmup, args.steps)
    rows = sum(rows_of_step(s, examples, batch_size) for s in range(first + 1, last + 1))
    tokens_a_mail = float(np.count_nonzero(ids)) / examples
    result = {
        "side": args.child,
        "window": [first, last],
        "seconds": seconds,
        "examples_per_second": rows / seconds,
        "real_tokens_per_second": rows / seconds * tokens_a_mail,
        **how,
    }
    print(json.dumps(result))


# === Rounds ===


def run_side(side, args, scratch):
    command = [sys.executable, __file__, "--steps", str(args.steps), "--jit", args.jit, "--child", side]
    command += ["--run-dir", os.path.join(scratch, "run")]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "AMPTRAIN_CACHE_DIR": os.path.join(scratch, "cache")}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{side} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def spread(values):
    return f"median {statistics.median(values):,.0f}, min {min(values):,.0f}, max {max(values):,.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="timed steps a measurement (after the warm-up)")
    parser.add_argument(
        "--jit", default="auto", help="amptrain's runtime.jit_compile: auto (the example's), off, on or fusible"
    )
    parser.add_argument("--child", choices=("keras", "amptrain"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    name, flags = cpu()
    shown = ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in flags.items())
    print(f"cpu: {name}, {os.cpu_count()} cores; {shown}")
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    print(f"classic recipe, mixed_float16, 50 steps per execution, batch 32; {args.steps} timed steps, jit {args.jit}")
    speeds = {"keras": [], "amptrain": []}
    tokens = {"keras": [], "amptrain": []}
    with tempfile.TemporaryDirectory(prefix="classic-vs-fit-") as scratch:
        for round_ in range(args.rounds):
            for side in ("keras", "amptrain") if round_ % 2 == 0 else ("amptrain", "keras"):
                result = run_side(side, args, scratch)
                speeds[side].append(result["examples_per_second"])
                tokens[side].append(result["real_tokens_per_second"])
                first, last = result["window"]
                how = f"jit {result['jit_compile']}" + (f" ({result['choice']})" if result.get("choice") else "")
                print(
                    f"round {round_ + 1} {side}: steps {first}-{last} in {result['seconds']:.1f} s, "
                    f"{result['examples_per_second']:,.0f} examples/s, "
                    f"{result['real_tokens_per_second']:,.0f} real tokens/s; {how}",
                    flush=True,
                )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for side in ("keras", "amptrain"):
        print(f"{side} examples/s: {spread(speeds[side])}; real tokens/s: {spread(tokens[side])}")
    ratios = [a / k for a, k in zip(speeds["amptrain"], speeds["keras"])]
    print(f"ratio {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}, rounds {len(ratios)})")


if __name__ == "__main__":
    main()
