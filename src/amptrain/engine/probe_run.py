"""The precision probe's measurement: a few compiled training steps of the run's own model
on its own dominant batch shape, under each candidate (`precision/probe.py` decides).

    measured = measure_candidates(task, config, strategy, found, planned_steps=456)
    measured.results  # {Candidate: [tokens/s of each round] or "error text"}

Each candidate gets its own model and training parts, built the way `amptrain fit`
builds them (`engine.build`), one compiling graph call and `WARMUP_CALLS` more. Then
rounds, the candidates taking turns within a round so that a machine's slow spell hits them
all: one graph call each that is not counted (on a Xeon every candidate's first round after
its warm-up ran at a third of its later speed: spam config, 9,074 then 32,005-34,331
tokens/s in float32), then up to `ROUNDS` counted rounds of at least `ROUND_STEPS` steps.
After the first counted round a candidate under half the fastest's speed is dropped (it
cannot win), and no round starts once the rounds have taken `ROUNDS_BUDGET` seconds or a
`ROUNDS_SHARE` of the best candidate's estimated run, whichever is more.

The cost, per candidate: building and compiling (10-25 s a candidate on the 2-core Xeon),
then `steps_per_execution * (2 + WARMUP_CALLS)` + up to `ROUNDS * ROUND_STEPS` steps, on one
batch shape (the run compiles the others as it meets them).
"""

import gc
import logging
import time

from amptrain.precision.probe import apply

logger = logging.getLogger("amptrain")

WARMUP_CALLS = 1
ROUNDS = 3
ROUND_STEPS = 4
ROUNDS_BUDGET = 60.0
ROUNDS_SHARE = 0.05


def dominant_batch(task):
    """(dataset repeating one real training batch, its shape): the batch of the padded
    length that carries the most padded tokens over an epoch, the shape most of a run's
    time goes to."""
    from amptrain.data.pipeline import plan_dataset

    split = task.splits["train"]
    plan = task.plan(split, shuffle=True)
    tokens, first = {}, {}
    for step in range(plan.steps_per_epoch):
        indices, length = plan.batch(step)[:2]
        key = length if isinstance(length, int) else tuple(length)
        tokens[key] = tokens.get(key, 0) + len(indices) * (sum(key) if isinstance(key, tuple) else key)
        first.setdefault(key, step)
    length = max(tokens, key=tokens.get)
    step = first[length]
    rows = len(plan.batch(step)[0])

    class One:
        steps_per_epoch = 1

        def batch(self, index):
            return plan.batch(step)

    dataset = plan_dataset(One(), task.batch_builder(split), task.signature()).repeat()
    return dataset, (rows, *(length if isinstance(length, tuple) else (length,)))


def measure_candidates(task, config, strategy, found, planned_steps, progress=None):
    """The `precision.probe.Measurement` of each candidate in `found`."""
    import keras

    from amptrain.distribute import distribute_batches
    from amptrain.precision.probe import Measurement

    progress = progress or logger.info
    started = time.perf_counter()
    dataset, shape = dominant_batch(task)
    iterator = iter(distribute_batches(strategy, lambda: dataset))
    spe = config.runtime.steps_per_execution
    calls = max(1, -(-ROUND_STEPS // spe))
    progress(
        f"precision probe: {len(found)} candidates ({', '.join(c.label() for c in found)}) on batches of "
        f"{' x '.join(map(str, shape))}, up to {ROUNDS} rounds of {calls * spe} steps each after warm-up"
    )
    trainers, results, compiles, tokens_per_step = {}, {}, {}, 0.0
    for candidate in found:
        try:
            trainers[candidate], compiles[candidate], tokens_per_step = _ready(task, config, strategy, candidate,
                                                                               iterator)  # fmt: skip
            results[candidate] = []
            progress(f"precision probe: {candidate.label()} compiled ({compiles[candidate]:.1f} s)")
        except Exception as error:  # a candidate that cannot run here is reported, not fatal
            results[candidate] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            progress(f"precision probe: {candidate.label()} failed ({results[candidate]})")
    for trainer in trainers.values():  # the round that is not counted
        _tokens_per_second(trainer, iterator, spe, 1)
    rounds_began = time.perf_counter()
    for round_index in range(ROUNDS):
        for candidate, trainer in trainers.items():
            results[candidate].append(_tokens_per_second(trainer, iterator, spe, calls))
        if round_index == 0 and trainers:
            for slow in _slow(results, trainers):
                progress(f"precision probe: {slow.label()} under half the fastest's speed, not timed again")
                del trainers[slow]
            best_run = planned_steps * tokens_per_step / max(results[c][0] for c in trainers)
            budget = max(ROUNDS_BUDGET, ROUNDS_SHARE * best_run)
        if trainers and time.perf_counter() - rounds_began > budget:
            break
    trainers.clear()
    keras.backend.clear_session()  # the run's model is named as if no probe had run
    gc.collect()
    shapes = len(task.train_buckets())
    return Measurement(results, compiles, time.perf_counter() - started, shape, tokens_per_step, shapes)


def _ready(task, config, strategy, candidate, iterator):
    """(trainer, seconds its first call took beyond an ordinary call's, real tokens a
    step): the candidate's model and training parts, built, compiled and warmed up."""
    from amptrain.engine.build import build_training, seed

    trial = apply(config, {"policy": candidate.policy, "jit_compile": candidate.jit_compile})
    seed(trial.runtime)
    spe = config.runtime.steps_per_execution
    began = time.perf_counter()
    model, _, _ = task.create_model(strategy, policy=candidate.policy)
    parts = build_training(
        model, task.loss, trial, strategy, candidate.policy, total_steps=10**6, learning_rates=task.learning_rate_scales
    )
    parts.trainer.train(iterator, spe)
    first = time.perf_counter() - began
    for _ in range(WARMUP_CALLS):
        began = time.perf_counter()
        totals = parts.trainer.train(iterator, spe)
        ordinary = time.perf_counter() - began
    return parts.trainer, max(0.0, first - ordinary), float(totals["tokens"][0]) / spe


def _tokens_per_second(trainer, iterator, spe, calls):
    tokens, began = 0, time.perf_counter()
    for _ in range(calls):
        tokens += int(trainer.train(iterator, spe)["tokens"][0])  # numpy: the call has finished
    return tokens / (time.perf_counter() - began)


def _slow(results, timed):
    """The timed candidates whose first round ran under half the fastest's speed."""
    fastest = max(results[c][0] for c in timed)
    return [c for c in list(timed) if results[c][0] < fastest / 2]


def decide_for_run(config, task, strategy, run_dir, write=True):
    """The run's precision decision (`precision.probe.decide`): the run folder's on resume,
    else named, rule, cached or measured here under `strategy`; written to the run
    folder's `precision.json` when `write` (the chief)."""
    import os

    from amptrain.precision import probe

    path = os.path.join(run_dir, probe.RECORD_FILE)
    hardware = probe.Hardware.detect()
    planned = config.train.total_steps(max(1, task.steps_per_epoch // config.train.accumulation_steps))
    record = probe.decide(
        config,
        hardware,
        planned,
        key_fn=lambda found: probe.cache_key(hardware, config, dominant_batch(task)[1], found),
        measure=lambda found: measure_candidates(task, config, strategy, found, planned),
        recorded=probe.read_record(path),
    )
    if write:
        probe.write_record(path, record)
    return record
