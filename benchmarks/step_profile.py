"""Where a training step's time goes, per batch shape: is it proportional to the padded
tokens, or is there a fixed floor a step? The model, data and settings of
`benchmarks/bucketing.py` (en-es English side, max_length 64, XLA, 4 steps a call).

    .venv/bin/python -u benchmarks/step_profile.py [--rounds 5] [--calls 12] [--set KEY=VALUE]...
    .venv/bin/python -u benchmarks/step_profile.py --lengths 16,32,64 --steps-only   # fused against unfused

For each padded length 8, 16, ..., 64 (or `--lengths`) a real batch of that shape (sentences of about
that length) is served from memory, and three things are timed, shapes interleaved
round by round (the median over rounds is reported):

  step   a whole training step through `Trainer.train` (forward and backward, the
         reduce, finiteness checks, the gradient norm, AdamW's update, counters), the
         engine's one-device path: all of it one XLA cluster (`Trainer.fused`);
  unfused  the same step with only the forward and backward pass under XLA and the rest
         run by the TensorFlow executor (`fuse_step=False`: the path several replicas
         take), on a second model built alike, timed next to it;
  fwd+bwd  the XLA-compiled forward and backward pass alone (`Trainer.forward_backward`);
  rest   step - fwd+bwd: what a step costs that does not depend on the batch's length.

Each round's times are printed as it ends (a crash loses nothing), and the per-round
difference unfused - fused a shape. `--steps-only` stops there (it was
`benchmarks/fused_vs_unfused.py`).

Then `step = a + b * padded tokens` fitted by least squares, what the per-shape step
times predict for the bucketing ratio (an epoch of each plan at those times), AdamW's
update alone (outside XLA, and under XLA), the input pipeline alone (the Python batch
plan through `tf.data`, which runs beside the steps on the same 2 cores), and bucketing
on against off with the real plans interleaved chunk by chunk in this one process,
through the plan and from memory (the fused trainer).
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def shape_batches(task, lengths, batch_size):
    """{padded length: a real batch of the sentences nearest below that length}."""
    import numpy as np

    split = task.splits["train"]
    build = task.batch_builder(split)
    order = np.argsort(split.lengths, kind="stable")
    batches = {}
    for length in lengths:
        fitting = order[split.lengths[order] <= length]
        indices = fitting[-batch_size:]
        batches[length] = build(indices, length)
    return batches


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=12, help="graph calls a shape a round")
    parser.add_argument("--lengths", help="padded lengths to time, e.g. 16,32,64 (default: every multiple of 8)")
    parser.add_argument("--steps-only", action="store_true", help="time the fused and unfused steps only")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()

    config, task, model, trainer, unfused, policy = build(args.set)
    spe = config.runtime.steps_per_execution
    lengths = (
        [int(n) for n in args.lengths.split(",")] if args.lengths else list(range(8, config.data.max_length + 1, 8))
    )
    sides = Sides(task, trainer, unfused, lengths, config.train.batch_size, spe)
    print(
        f"policy {policy}, batch {config.train.batch_size}, {spe} steps a graph call, "
        f"XLA {config.runtime.jit_compile}, "
        f"{args.rounds} rounds of {args.calls} calls a shape",
        flush=True,
    )
    times = sides.time(args.rounds, args.calls, with_parts=not args.steps_only)
    report_steps(lengths, times)
    if args.steps_only:
        return
    table = report_shapes(lengths, times, config.train.batch_size, trainer)
    if lengths == list(range(8, config.data.max_length + 1, 8)):
        report_bucketing(task, config, lengths, table)
    else:  # an epoch meets every length
        print("bucketing prediction: needs every padded length (leave out --lengths)")
    dataset = task.train_dataset(0)
    count, started = 0, time.perf_counter()
    for _ in dataset.take(200):
        count += 1
    print(f"input pipeline alone: {(time.perf_counter() - started) * 1e3 / count:.2f} ms a batch")
    paired(task, trainer, spe, args)


def build(overrides):
    """The config, task, model, the fused and unfused trainers (built alike) and the policy."""
    import tempfile

    from bucketing import CONFIG, base_overrides, write_english_csv

    from amptrain import config as config_lib
    from amptrain.bench.building import build_trainer

    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "english.csv")
        write_english_csv(data)
        config = config_lib.load_config(CONFIG, [*base_overrides(data), "data.bucketing=true", *overrides])
        task, model, trainer, policy = build_trainer(config)
    _, _, unfused, _ = build_trainer(config, task=task, fuse_step=False)
    assert trainer.fused and not unfused.fused, "the step profile wants one device and XLA"
    return config, task, model, trainer, unfused, policy


class Sides:
    """What is timed a shape: the fused step, the unfused step, the forward and backward pass,
    and AdamW's update alone (outside XLA and under it), every shape compiled first."""

    def __init__(self, task, trainer, unfused, lengths, batch_size, spe):
        import tensorflow as tf

        self.trainer, self.unfused, self.lengths, self.spe = trainer, unfused, lengths, spe
        batches = shape_batches(task, lengths, batch_size)
        self.iterators = {n: iter(tf.data.Dataset.from_tensors(b).repeat()) for n, b in batches.items()}
        self.unfused_iterators = {n: iter(tf.data.Dataset.from_tensors(b).repeat()) for n, b in batches.items()}
        self.tensors = {n: tf.nest.map_structure(tf.constant, b) for n, b in batches.items()}
        self.scale = trainer.current_scale()
        for n in lengths:  # compile every shape first
            trainer.train(self.iterators[n], spe)
            unfused.train(self.unfused_iterators[n], spe)
            self.fwd_bwd(n)
        # AdamW's update alone, on gradients of zeros (the unfused trainer's model: its
        # weights are timed but never compared): as the unfused step runs it, outside XLA,
        # and compiled by XLA as the fused step runs it.
        zeros = [tf.zeros_like(v) for v in unfused.variables]
        self.apply = tf.function(lambda: (unfused.apply_gradients(zeros), tf.constant(0))[1])
        self.apply_xla = tf.function(lambda: (unfused.apply_gradients(zeros), tf.constant(0))[1], jit_compile=True)
        self.apply().numpy()
        self.apply_xla().numpy()

    def fwd_bwd(self, n):
        features, targets, _ = self.tensors[n]
        loss, _, _ = self.trainer.forward_backward(features, targets, self.scale)
        loss.numpy()

    def time(self, rounds, calls, with_parts=True):
        """{name: {length: [ms a step, a round]}} (the update's under length 0), shapes and
        sides interleaved round by round."""
        names = ("step", "unfused", "fwd+bwd", "apply", "apply_xla")
        times = {name: {n: [] for n in [0, *self.lengths]} for name in names}
        steps = calls * self.spe
        for round_ in range(rounds):
            if with_parts:
                times["apply"][0].append(_timed(lambda: self.apply().numpy(), steps) / steps)
                times["apply_xla"][0].append(_timed(lambda: self.apply_xla().numpy(), steps) / steps)
            for n in self.lengths if round_ % 2 == 0 else reversed(self.lengths):
                pair = [("step", self.trainer, self.iterators), ("unfused", self.unfused, self.unfused_iterators)]
                for name, side, iterators in pair if round_ % 2 == 0 else reversed(pair):
                    call = lambda side=side, it=iterators[n]: side.train(it, self.spe)  # noqa: E731
                    times[name][n].append(_timed(call, calls) / steps)
                if with_parts:
                    times["fwd+bwd"][n].append(_timed(lambda n=n: self.fwd_bwd(n), steps) / steps)
            shown = ", ".join(
                f"{name} {n}: {times[name][n][-1]:.2f}" for n in self.lengths for name in ("step", "unfused")
            )
            print(f"round {round_ + 1} (ms a step): {shown}", flush=True)
        return times


def _timed(call, times):
    started = time.perf_counter()
    for _ in range(times):
        call()
    return (time.perf_counter() - started) * 1e3


def report_steps(lengths, times):
    """The fused and unfused medians a shape, and their per-round difference."""
    for n in lengths:
        fused, unfused = times["step"][n], times["unfused"][n]
        diffs = [b - a for a, b in zip(fused, unfused)]
        print(
            f"length {n}: fused median {statistics.median(fused):.2f} ms (min {min(fused):.2f}), "
            f"unfused {statistics.median(unfused):.2f} (min {min(unfused):.2f}); unfused - fused per round: "
            f"median {statistics.median(diffs):.2f} ms (min {min(diffs):.2f}, max {max(diffs):.2f})",
            flush=True,
        )


def report_shapes(lengths, times, batch_size, trainer):
    """The table a shape, the linear fits of step time on padded tokens, AdamW's update alone;
    returns the medians (tokens, step, unfused, fwd+bwd, fastest step) a shape."""
    import numpy as np

    step_ms, unfused_ms, fb_ms = times["step"], times["unfused"], times["fwd+bwd"]
    print(
        f"{'length':>6} {'padded tok':>10} {'step ms':>8} {'min':>6} {'max':>6} {'unfused':>8} {'min':>6} "
        f"{'fwd+bwd ms':>10} {'rest ms':>7} {'unfused':>7} {'us/padded tok':>13}"
    )
    table = []
    for n in lengths:
        step, old, fb = statistics.median(step_ms[n]), statistics.median(unfused_ms[n]), statistics.median(fb_ms[n])
        tokens = n * batch_size
        table.append((tokens, step, old, fb, min(step_ms[n])))
        print(
            f"{n:>6} {tokens:>10,} {step:>8.2f} {min(step_ms[n]):>6.2f} {max(step_ms[n]):>6.2f} {old:>8.2f} "
            f"{min(unfused_ms[n]):>6.2f} {fb:>10.2f} {step - fb:>7.2f} {old - fb:>7.2f} {step * 1e3 / tokens:>13.2f}"
        )
    tokens, steps, olds, fbs, mins = (np.array(column, float) for column in zip(*table))
    (b, a), (old_b, old_a), (fb_b, fb_a), (min_b, min_a) = (np.polyfit(tokens, y, 1) for y in (steps, olds, fbs, mins))
    print(
        f"fit of the medians: step ms = {a:.2f} + {b * 1e3:.2f} us x padded tokens "
        f"(unfused: {old_a:.2f} + {old_b * 1e3:.2f}; fwd+bwd alone: {fb_a:.2f} + {fb_b * 1e3:.2f}); "
        f"of the fastest rounds: {min_a:.2f} + {min_b * 1e3:.2f} us x padded tokens"
    )
    print(
        f"unfused step - fused step, median over shapes: {statistics.median(olds - steps):.2f} ms "
        f"(min {min(olds - steps):.2f}, max {max(olds - steps):.2f})"
    )
    apply_ms, apply_xla_ms = times["apply"][0], times["apply_xla"][0]
    print(
        f"AdamW's update alone ({len(trainer.variables)} variables, "
        f"{sum(int(np.prod(v.shape)) for v in trainer.variables):,} parameters), a graph call of its own: "
        f"outside XLA {statistics.median(apply_ms):.2f} ms (min {min(apply_ms):.2f}, max {max(apply_ms):.2f}), "
        f"under XLA {statistics.median(apply_xla_ms):.2f} ms (min {min(apply_xla_ms):.2f}, max {max(apply_xla_ms):.2f})"
    )
    return table


def report_bucketing(task, config, lengths, table):
    """What the per-shape step times predict for benchmarks/bucketing.py's ratio."""
    from amptrain.data.batching import BatchPlan, bucket_boundaries

    batch_size = config.train.batch_size
    split_lengths = task.splits["train"].lengths
    _, steps, olds, _, mins = zip(*table)
    medians, fastest, unfused_medians = dict(zip(lengths, steps)), dict(zip(lengths, mins)), dict(zip(lengths, olds))
    epochs = {}
    for name, boundaries in (
        ("off", [lengths[-1]]),
        ("on", bucket_boundaries(split_lengths, config.data.max_length, config.data.num_buckets, batch_size)),
    ):
        epoch = BatchPlan(split_lengths, batch_size, boundaries, seed=0).epoch(0)
        padded = sum(len(indices) * length for indices, length in epoch)
        seconds = [sum(times[length] for _, length in epoch) / 1e3 for times in (medians, fastest, unfused_medians)]
        epochs[name] = (padded, *seconds)
        print(
            f"bucketing {name}: boundaries {boundaries}, padded/real {padded / split_lengths.sum():.3f}, "
            f"an epoch of {len(epoch)} steps at the measured step times: {seconds[0]:.2f} s (fastest rounds "
            f"{seconds[1]:.2f} s; unfused {seconds[2]:.2f} s)"
        )
    (off_padded, off_median, off_fastest, off_unfused), (on_padded, on_median, on_fastest, on_unfused) = (
        epochs["off"],
        epochs["on"],
    )
    print(
        f"predicted ratio {off_median / on_median:.2f} (fastest rounds {off_fastest / on_fastest:.2f}; unfused "
        f"{off_unfused / on_unfused:.2f}; if time were proportional to padded tokens: {off_padded / on_padded:.2f})"
    )


def paired(task, trainer, spe, args):
    """Bucketing on against off with the real batch plans, interleaved in this process
    chunk by chunk (so the other jobs on the machine weigh on both alike), through the
    Python plan and `tf.data` as in training ("plan"), and from the same batches held in
    memory ("memory": no Python in the loop), one model for all."""
    import copy

    import tensorflow as tf

    from amptrain.data.batching import round_up

    # The same task with its training split padded to max_length (bucketing off).
    off_task = copy.copy(task)
    off_task.splits = {"train": copy.copy(task.splits["train"])}
    off_task.splits["train"].boundaries = off_task.boundaries = [round_up(task.config.data.max_length)]
    sides = {}
    for name, side_task in (("on", task), ("off", off_task)):
        sides[f"{name}, plan"] = iter(side_task.train_dataset(0))
        held = [tuple(b) for b in side_task.train_dataset(10**4).take(64)]
        dataset = tf.data.Dataset.from_tensors(held[0])
        for batch in held[1:]:
            dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
        sides[f"{name}, memory"] = iter(dataset.repeat())
    for iterator in sides.values():  # warm up; every shape is compiled already
        for _ in range(4):
            trainer.train(iterator, spe)
    speeds = {name: [] for name in sides}
    step_ms = {name: [] for name in sides}
    names = list(sides)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            tokens, started = 0, time.perf_counter()
            for _ in range(args.calls):
                tokens += int(trainer.train(sides[name], spe)["tokens"][0])
            seconds = time.perf_counter() - started
            speeds[name].append(tokens / seconds)
            step_ms[name].append(seconds * 1e3 / (args.calls * spe))
    print(f"real batch plans, interleaved chunks of {args.calls * spe} steps, {args.rounds} rounds:")
    for name in names:
        print(
            f"  bucketing {name}: {statistics.median(speeds[name]):,.0f} real tokens/s, "
            f"{statistics.median(step_ms[name]):.1f} ms a step "
            f"(min {min(step_ms[name]):.1f}, max {max(step_ms[name]):.1f})"
        )
    for source in ("plan", "memory"):
        ratios = [a / b for a, b in zip(speeds[f"on, {source}"], speeds[f"off, {source}"])]
        print(
            f"  ratio on/off, {source}: {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}, "
            f"rounds {len(ratios)})"
        )


if __name__ == "__main__":
    main()
