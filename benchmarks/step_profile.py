"""Where a training step's time goes, per batch shape: is it proportional to the padded
tokens, or is there a fixed floor a step? The model, data and settings of
`benchmarks/bucketing.py` (en-es English side, max_length 64, XLA, 4 steps a call).

    .venv/bin/python benchmarks/step_profile.py [--rounds 5] [--calls 12] [--set KEY=VALUE]...

For each padded length 8, 16, ..., 64 a real batch of that shape (sentences of about
that length) is served from memory, and three things are timed, shapes interleaved
round by round (the median over rounds is reported):

  step   a whole training step through `Trainer.train` (forward and backward, the
         reduce, finiteness checks, the gradient norm, AdamW's update, counters), the
         engine's one-device path: all of it one XLA cluster (`Trainer.fused`);
  unfused  the same step with only the forward and backward pass under XLA and the rest
         run by the TensorFlow executor (`fuse_step=False`: the path several replicas
         take), on a second model built alike, timed next to it;
  fwd+bwd  the XLA-compiled forward and backward pass alone (`Trainer._forward_backward`);
  rest   step - fwd+bwd: what a step costs that does not depend on the batch's length.

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
    build = task._batch_builder(split)
    order = np.argsort(split.lengths, kind="stable")
    batches = {}
    for length in lengths:
        fitting = order[split.lengths[order] <= length]
        indices = fitting[-batch_size:]
        batches[length] = build(indices, length)
    return batches


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tempfile

    import numpy as np
    from bucketing import CONFIG, base_overrides, write_english_csv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=12, help="graph calls a shape a round")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()

    import tensorflow as tf

    from amptrain import config as config_lib
    from amptrain.bench.worker import build_trainer
    from amptrain.data.batching import BatchPlan, bucket_boundaries

    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "english.csv")
        write_english_csv(data)
        config = config_lib.load_config(CONFIG, [*base_overrides(data), "data.bucketing=true", *args.set])
        task, model, trainer, policy = build_trainer(config)
    _, _, unfused, _ = build_trainer(config, task=task, fuse_step=False)
    assert trainer.fused and not unfused.fused, "the step profile wants one device and XLA"
    spe = config.runtime.steps_per_execution
    batch_size = config.train.batch_size
    lengths = list(range(8, config.data.max_length + 1, 8))
    batches = shape_batches(task, lengths, batch_size)
    iterators = {n: iter(tf.data.Dataset.from_tensors(b).repeat()) for n, b in batches.items()}
    unfused_iterators = {n: iter(tf.data.Dataset.from_tensors(b).repeat()) for n, b in batches.items()}
    scale = trainer._current_scale()

    def fwd_bwd(batch):
        features, targets, _ = batch
        loss, _, _ = trainer._forward_backward(features, targets, scale)
        loss.numpy()

    tensors = {n: tf.nest.map_structure(tf.constant, b) for n, b in batches.items()}
    for n in lengths:  # compile every shape first
        trainer.train(iterators[n], spe)
        unfused.train(unfused_iterators[n], spe)
        fwd_bwd(tensors[n])
    # AdamW's update alone, on gradients of zeros (the unfused trainer's model: its
    # weights are timed but never compared): as the unfused step runs it, outside XLA,
    # and compiled by XLA as the fused step runs it.
    zeros = [tf.zeros_like(v) for v in unfused.variables]
    apply = tf.function(lambda: (unfused._apply(zeros), tf.constant(0))[1])
    apply_xla = tf.function(lambda: (unfused._apply(zeros), tf.constant(0))[1], jit_compile=True)
    apply().numpy()
    apply_xla().numpy()
    apply_ms, apply_xla_ms = [], []
    step_ms, unfused_ms, fb_ms = {n: [] for n in lengths}, {n: [] for n in lengths}, {n: [] for n in lengths}

    def timed(call, times):
        started = time.perf_counter()
        for _ in range(times):
            call()
        return (time.perf_counter() - started) * 1e3

    for round_ in range(args.rounds):
        apply_ms.append(timed(lambda: apply().numpy(), args.calls * spe) / (args.calls * spe))
        apply_xla_ms.append(timed(lambda: apply_xla().numpy(), args.calls * spe) / (args.calls * spe))
        for n in lengths if round_ % 2 == 0 else reversed(lengths):
            pair = [(step_ms, trainer, iterators), (unfused_ms, unfused, unfused_iterators)]
            for times, side, side_iterators in pair if round_ % 2 == 0 else reversed(pair):
                call = lambda side=side, it=side_iterators[n]: side.train(it, spe)  # noqa: E731
                times[n].append(timed(call, args.calls) / (args.calls * spe))
            fb_ms[n].append(timed(lambda n=n: fwd_bwd(tensors[n]), args.calls * spe) / (args.calls * spe))

    print(
        f"policy {policy}, batch {batch_size}, {spe} steps a graph call, XLA {config.runtime.jit_compile}, "
        f"{args.rounds} rounds of {args.calls} calls a shape"
    )
    print(
        f"{'length':>6} {'padded tok':>10} {'step ms':>8} {'min':>6} {'max':>6} {'unfused':>8} {'min':>6} "
        f"{'fwd+bwd ms':>10} {'rest ms':>7} {'unfused':>7} {'us/padded tok':>13}"
    )
    table = []
    for n in lengths:
        step, old, fb = statistics.median(step_ms[n]), statistics.median(unfused_ms[n]), statistics.median(fb_ms[n])
        tokens = n * batch_size
        table.append((tokens, step, old, fb))
        print(
            f"{n:>6} {tokens:>10,} {step:>8.2f} {min(step_ms[n]):>6.2f} {max(step_ms[n]):>6.2f} {old:>8.2f} "
            f"{min(unfused_ms[n]):>6.2f} {fb:>10.2f} {step - fb:>7.2f} {old - fb:>7.2f} {step * 1e3 / tokens:>13.2f}"
        )
    tokens, steps, olds, fbs = (np.array(column, float) for column in zip(*table))
    b, a = np.polyfit(tokens, steps, 1)
    old_b, old_a = np.polyfit(tokens, olds, 1)
    fb_b, fb_a = np.polyfit(tokens, fbs, 1)
    mins = np.array([min(step_ms[n]) for n in lengths])
    min_b, min_a = np.polyfit(tokens, mins, 1)
    print(
        f"fit of the medians: step ms = {a:.2f} + {b * 1e3:.2f} us x padded tokens "
        f"(unfused: {old_a:.2f} + {old_b * 1e3:.2f}; fwd+bwd alone: {fb_a:.2f} + {fb_b * 1e3:.2f}); "
        f"of the fastest rounds: {min_a:.2f} + {min_b * 1e3:.2f} us x padded tokens"
    )
    print(
        f"unfused step - fused step, median over shapes: {statistics.median(olds - steps):.2f} ms "
        f"(min {min(olds - steps):.2f}, max {max(olds - steps):.2f})"
    )
    print(
        f"AdamW's update alone ({len(trainer.variables)} variables, "
        f"{sum(int(np.prod(v.shape)) for v in trainer.variables):,} parameters), a graph call of its own: "
        f"outside XLA {statistics.median(apply_ms):.2f} ms (min {min(apply_ms):.2f}, max {max(apply_ms):.2f}), "
        f"under XLA {statistics.median(apply_xla_ms):.2f} ms (min {min(apply_xla_ms):.2f}, max {max(apply_xla_ms):.2f})"
    )

    # What the fit predicts for benchmarks/bucketing.py's ratio.
    split_lengths = task.splits["train"].lengths
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

    dataset = task.train_dataset(0)
    count, started = 0, time.perf_counter()
    for _ in dataset.take(200):
        count += 1
    print(f"input pipeline alone: {(time.perf_counter() - started) * 1e3 / count:.2f} ms a batch")
    paired(task, trainer, spe, args)


def paired(task, trainer, spe, args):
    """Bucketing on against off with the real batch plans, interleaved in this process
    chunk by chunk (so the other jobs on the machine weigh on both alike), through the
    Python plan and `tf.data` as in training ("plan"), and from the same batches held in
    memory ("memory": no Python in the loop), one model for all."""
    import copy

    import tensorflow as tf

    from amptrain.data.batching import round_up

    off_task = copy.copy(task)
    off_task.boundaries = [round_up(task.config.data.max_length)]
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
