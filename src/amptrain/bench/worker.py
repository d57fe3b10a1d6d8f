"""One benchmark measurement in a process of its own, so its peak memory is its own.

    python -m amptrain.bench.worker '{"kind": "combination", "config": "...", ...}'
    python -m amptrain.bench.worker '{"kind": "peak", "dtype": "float32"}'
    python -m amptrain.bench.worker '{"kind": "devices"}'
    python -m amptrain.bench.worker '{"kind": "estimate", "config": "...", "overrides": [], "precision": "float32"}'

Prints one JSON line (the last line of its output) with the measurements. The runner
(`bench/runner.py`) starts one of these per combination, forked after its import where it
can be (`forked.py`), else as the command above.

A combination is timed the way the engine trains: the same task data and model, and the
optimizer, loss scaler, weight average and `StepRunner` (accumulation and stop conditions
included) from the builder `amptrain fit` uses (`engine.build.build_training`),
`steps_per_execution` steps a graph call. The first call
(tracing, XLA compilation, the first steps) is timed apart as `compile_seconds`; then,
with real data, one step of each bucket's shape (XLA compiles once per batch shape, and
the rarest bucket may have one batch an epoch); the warm-up goes on to `warmup_steps`
(default 48 with real data); then `repeats` runs of `steps` steps, each call
synchronised by reading its totals back, the steps counted by `trainer.step`.
"""

import json
import resource
import sys
import time

import numpy as np

from amptrain import config as config_lib
from amptrain.bench.building import build_trainer


def measure_combination(spec):
    import tensorflow as tf

    from amptrain import distribute
    from amptrain.distribute import distribute_batches

    config = config_lib.load_config(spec["config"], spec["overrides"])
    distribute.configure_devices(config.runtime)  # runtime.cpu_replicas, before TensorFlow starts
    placement = distribute.select_strategy(config.runtime)
    task, model, trainer, policy = build_trainer(config, placement.strategy, fuse_step=spec.get("fuse_step", True))
    strategy = trainer.strategy
    dataset = task.train_dataset(0) if spec["data"] == "real" else one_batch_repeated(task.train_dataset(0))
    # Replica r gets slice r of each global batch, as in `amptrain fit`.
    iterator = iter(distribute_batches(strategy, lambda: dataset))
    spe = config.runtime.steps_per_execution
    warmup = spec.get("warmup_steps") or (max(spe, 48) if spec["data"] == "real" else spe)
    shapes = None
    if spec["data"] == "real":  # every bucket's shape is compiled before the clock starts
        shapes = (iter(distribute_batches(strategy, lambda: one_batch_per_shape(task))), len(task.train_buckets()))
    timing = _time_steps(trainer, iterator, spe, warmup, spec["steps"], spec["repeats"], shapes)
    return {
        **timed_row(timing, model, trainer, policy, placement.name),
        "peak_memory_bytes": _peak_memory(tf),
        "peak_memory_source": "GPU:0 peak (get_memory_info)"
        if tf.config.list_physical_devices("GPU")
        else "process peak RSS",
    }


def timed_row(timing, model, trainer, policy, strategy_name):
    """A combination's row from its timing (`_time_steps`) and what was timed: speeds, FLOPs
    per token (None: a layer cannot be counted, MFU unknown), skips, strategy."""
    from amptrain.engine.memory import VARIABLE_RECORD, variable_parts
    from amptrain.hardware.flops import count_flops

    # Rows counted by the trainer: under `data.tokens_per_batch` they vary by bucket.
    mean_length = timing["padded_tokens"] / max(timing["examples"], 1)
    flops = count_flops(model)
    parts = variable_parts(model, trainer.optimizer)  # what LoRA changes: trainable, gradients, slots
    return {
        **timing,
        **{name: parts[field] for field, name in VARIABLE_RECORD.items()},
        "policy": policy,
        "examples_per_second": timing["examples"] / timing["seconds"],
        "mean_padded_length": mean_length,
        "flops_per_token": flops.per_token(mean_length),
        "uncounted_layers": list(flops.uncounted),
        "skipped_steps": int(trainer.skipped_steps.numpy()),
        "fused_step": trainer.fused,
        "strategy": strategy_name,
        "num_replicas": trainer.strategy.num_replicas_in_sync,
    }


def _time_steps(trainer, iterator, steps_per_execution, warmup_steps, steps, repeats, shapes=None):
    """Times `repeats` runs of `steps` steps. Steps are counted by `trainer.step`, not
    assumed: a graph call that stops early (the loss scale at its floor) ran fewer, and
    the timing then ends there, counting the steps that ran (`steps_run`, `stopped`)."""
    started = time.perf_counter()
    trainer.train(iterator, steps_per_execution)
    compile_seconds = time.perf_counter() - started
    if shapes:  # (iterator, count): one step of each shape
        for _ in range(shapes[1]):
            trainer.train(shapes[0], 1)
    for _ in range(steps_per_execution, warmup_steps, steps_per_execution):
        trainer.train(iterator, steps_per_execution)
    warmup_seconds = time.perf_counter() - started
    step_times, seconds, tokens, examples, steps_run, stopped = [], 0.0, np.zeros(2, np.int64), 0, 0, 0
    for _ in range(repeats):
        done = 0
        started = time.perf_counter()
        while done < steps and not stopped:
            n = min(steps_per_execution, steps - done)
            before = int(trainer.step.numpy())
            call_started = time.perf_counter()
            totals = trainer.train(iterator, n)  # returns numpy: the call has finished
            ran = int(trainer.step.numpy()) - before
            if ran:
                step_times += [(time.perf_counter() - call_started) / ran] * ran
            tokens += totals["tokens"]
            examples += int(totals["examples"])
            done += ran
            stopped = int(totals["stop"])
        seconds += time.perf_counter() - started
        steps_run += done
    p10, p50, p90 = np.percentile(step_times, [10, 50, 90]) if step_times else (float("nan"),) * 3
    return {
        "compile_seconds": compile_seconds,
        "warmup_seconds": warmup_seconds,
        "seconds": seconds,
        "steps_run": steps_run,
        "stopped": stopped,
        "examples": examples,
        "real_tokens": int(tokens[0]),
        "padded_tokens": int(tokens[1]),
        "real_tokens_per_second": tokens[0] / seconds,
        "padded_tokens_per_second": tokens[1] / seconds,
        "step_time_p10": p10,
        "step_time_p50": p50,
        "step_time_p90": p90,
    }


def one_batch_per_shape(task):
    """The first training batch of each padded length (bucket) in the plan, in that
    order: a warm-up that makes XLA compile every shape a timed step can meet. (The rare
    shortest bucket may have one batch an epoch, which 48 shuffled steps would miss.)"""
    from amptrain.data.pipeline import plan_dataset

    if len(task.train_buckets()) == 1:  # one shape (a language model's blocks): any batch has it
        return task.train_dataset(0)
    split = task.splits["train"]
    plan = task.plan(split, shuffle=True)
    first = {}
    for step in range(plan.steps_per_epoch):
        first.setdefault(plan.batch(step)[1], step)

    class Picked:
        steps = sorted(first.values())

        def batch(self, index):
            return plan.batch(self.steps[index % len(self.steps)])

    return plan_dataset(Picked(), task.batch_builder(split), task.signature())


def one_batch_repeated(dataset, look_at=32):
    """The longest of the first `look_at` real batches, served from memory forever: the
    model's speed without the input pipeline's (`--data synthetic`)."""
    longest = max(dataset.take(look_at), key=lambda batch: int(batch[2][:, 1].numpy().max()))
    import tensorflow as tf

    return tf.data.Dataset.from_tensors(longest).repeat()


def _peak_memory(tf):
    if tf.config.list_physical_devices("GPU"):
        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    from amptrain.engine.utilisation import resident_memory

    # The address space's own high-water mark (VmHWM): `ru_maxrss` also keeps the parent's
    # resident size at the fork before this process's exec, so a worker started from a large
    # process (a test runner's, say) reported that process's memory as its own peak.
    peak = resident_memory()[1]
    if peak:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure_peak(spec):
    from amptrain.hardware.flops import measure_matmul_peak

    size = spec.get("size", 2048)
    return {"dtype": spec["dtype"], "size": size, "flops": measure_matmul_peak(spec["dtype"], size)}


def estimate_memory(spec):
    """The memory estimate of a config at a precision (`bench/memory_plan.py`), before a run."""
    from amptrain.bench import memory_plan

    return memory_plan.plan_config(spec["config"], spec["overrides"], [spec["precision"]], spec.get("budget"))[0]


def list_devices(spec):
    """The accelerators, for a bench whose own process must not list them (it forks workers)."""
    from amptrain.precision.policy import describe_devices

    return {"devices": describe_devices()}


def main(argv=None):
    import os

    from amptrain import tf_logs

    tf_logs.quiet()  # its stderr is shown when it fails: the failure, not TensorFlow's start-up lines
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = json.loads((argv or sys.argv[1:])[0])
    kinds = {"peak": measure_peak, "devices": list_devices, "estimate": estimate_memory}
    measure = kinds.get(spec["kind"], measure_combination)
    result = measure(spec)
    print(json.dumps({key: _plain(value) for key, value in result.items()}))
    sys.stdout.flush()


def _plain(value):
    return value.item() if hasattr(value, "item") else value


if __name__ == "__main__":
    main()
