"""Our engine against the standard Keras recipe, on the same model and the same batches.

    .venv/bin/python benchmarks/engine_vs_keras_fit.py [CONFIG] [--rounds 5] [--steps 60]
        [--precision float32] [--jit on] [--steps-per-execution 8]

The recipe is the one the TensorFlow mixed-precision and performance guides teach: a
global dtype policy, `model.compile(..., steps_per_execution=K, jit_compile=...)`, and
`model.fit` on a batched, prefetched `tf.data.Dataset` (for `mixed_float16` Keras wraps the
optimizer in its `LossScaleOptimizer`). Both sides build the model with the task's
builder, train with AdamW under the same schedule, warm up on batches [0, K) (tracing
and compiling) and on K copies of one batch of each bucket length (so that no shape is
compiled while timed), and are timed on batches [K, K + steps) of the same batch plan, so
they see identical batches. Classification configs only (the recipe needs a Keras loss).

Each measurement is a process of its own, alternated keras/engine/engine/keras/... for
`rounds` rounds. The last line is the ratio of real tokens/s, engine over Keras:
`ratio 1.02 (min 0.97, max 1.06, rounds 5)`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def build(config_path, overrides):
    from amptrain import config as config_lib
    from amptrain.engine.build import seed
    from amptrain.tasks import prepared_in_scratch

    config = config_lib.load_config(config_path, overrides)
    if config.task != "classification":
        raise SystemExit("engine_vs_keras_fit.py: a classification config is needed")
    task = prepared_in_scratch(config)
    seed(config.runtime)
    return config, task


def real_tokens(task, start, steps):
    return sum(int(counts[:, 0].numpy().sum()) for _, _, counts in task.train_dataset(start).take(steps))


def every_shape(task, spe):
    """One batch of each bucket's padded length, each `spe` times: the warm-up after which
    neither side meets a shape it has not compiled while timed. (Each bucket shape is a
    trace and an XLA compile of 1 to 3 s on both sides; with them in the 60 timed steps,
    the ratio would compare compile times as much as steps.)"""
    import tensorflow as tf

    from amptrain.bench.worker import one_batch_per_shape

    batches = one_batch_per_shape(task).take(len(task.train_buckets()))
    return batches.flat_map(lambda *batch: tf.data.Dataset.from_tensors(batch).repeat(spe))


def measure_keras(config, task, steps):
    import keras

    from amptrain.engine.optimizer import build_optimizer

    policy = config.precision.policy
    keras.mixed_precision.set_global_policy(policy)
    model = task.build_model(policy)
    optimizer, _ = build_optimizer(config.train, total_steps=10**6)
    spe = config.runtime.steps_per_execution
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=spe,
        jit_compile=config.runtime.jit_compile,
    )

    def recipe(dataset):
        return dataset.map(lambda features, targets, counts: (features, targets["labels"], targets["weights"]))

    model.fit(recipe(task.train_dataset(0)), epochs=1, steps_per_epoch=spe, verbose=0)  # trace, compile
    model.fit(recipe(every_shape(task, spe)), epochs=1, steps_per_epoch=len(task.train_buckets()) * spe, verbose=0)
    started = time.perf_counter()
    model.fit(recipe(task.train_dataset(spe)), epochs=1, steps_per_epoch=steps, verbose=0)
    return time.perf_counter() - started


def measure_engine(config, task, steps):
    """Seconds and real tokens of `steps` steps after the warm-up, counted by the
    trainer (`trainer.step`, the tokens totals): a graph call may run fewer steps than
    asked (it stops early when the loss scale is at its floor)."""
    from amptrain.bench.building import build_trainer

    _, _, trainer, _ = build_trainer(config, task=task)
    spe = config.runtime.steps_per_execution
    iterator = iter(task.train_dataset(0))
    trainer.train(iterator, spe)  # trace, compile
    shapes = iter(every_shape(task, spe))
    for _ in task.train_buckets():
        trainer.train(shapes, spe)
    first = int(trainer.step.numpy())
    started = time.perf_counter()
    tokens = 0
    while int(trainer.step.numpy()) - first < steps:
        totals = trainer.train(iterator, min(spe, steps - (int(trainer.step.numpy()) - first)))
        tokens += int(totals["tokens"][0])
        if totals["stop"]:
            raise SystemExit(
                f"engine_vs_keras_fit.py: training stopped (reason {int(totals['stop'])}) "
                f"after {int(trainer.step.numpy()) - first} timed steps"
            )
    return time.perf_counter() - started, tokens


def child(args):
    overrides = [
        *args.set,
        f"precision.policy={args.precision}",
        f"runtime.jit_compile={args.jit == 'on'}".lower(),
        f"runtime.steps_per_execution={args.steps_per_execution}",
        "train.clip_norm=0",
    ]
    config, task = build(args.config, overrides)
    if args.child == "keras":
        seconds = measure_keras(config, task, args.steps)
        tokens = real_tokens(task, config.runtime.steps_per_execution, args.steps)
    else:
        seconds, tokens = measure_engine(config, task, args.steps)
    print(json.dumps({"side": args.child, "seconds": seconds, "real_tokens_per_second": tokens / seconds}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/classify-spam.toml")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--jit", choices=("on", "off"), default="on")
    parser.add_argument("--steps-per-execution", type=int, default=8)
    parser.add_argument("--child", choices=("keras", "engine"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    speeds = {"keras": [], "engine": []}
    for round_ in range(args.rounds):
        for side in ("keras", "engine") if round_ % 2 == 0 else ("engine", "keras"):
            command = [sys.executable, __file__, *sys.argv[1:], "--child", side]
            result = subprocess.run(
                command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
            )
            if result.returncode != 0:
                raise SystemExit(f"{side} failed:\n{result.stderr[-3000:]}")
            speeds[side].append(json.loads(result.stdout.strip().splitlines()[-1])["real_tokens_per_second"])
        print(
            f"round {round_ + 1}: keras {speeds['keras'][-1]:,.0f}, engine {speeds['engine'][-1]:,.0f} real tokens/s",
            flush=True,
        )
    ratios = [e / k for e, k in zip(speeds["engine"], speeds["keras"])]
    print(
        f"median real tokens/s: keras {statistics.median(speeds['keras']):,.0f}, "
        f"engine {statistics.median(speeds['engine']):,.0f}"
    )
    print(f"ratio {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}, rounds {len(ratios)})")


if __name__ == "__main__":
    main()
