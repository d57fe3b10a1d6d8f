"""The precision probe's trials: each candidate's model and training parts built the way
`amptrain fit` builds them (`engine.build`), compiled and timed on the task's probe batch
(`Task.probe_batches`).

    measured, trials = measure_candidates(task, config, strategy, plan)   # {Candidate: Trial}
    release(trials.values())                                             # their memory back to the system

`autoprecision/measurement.py` schedules them (order, budget, rounds); `decision.py`
decides with what they measured. A trial is built with the run's seed and planned steps,
and its state (weights, dropout seeds, optimizer slots, counters, loss scale, weight
average) can be put back to what it was before its first step (`rewind`): the winner then
starts the run exactly as a fresh build would, without building and compiling again.
"""

import dataclasses
import gc
import hashlib
import logging
import time

from amptrain.autoprecision import probe
from amptrain.autoprecision.measurement import SHARE, measure

logger = logging.getLogger("amptrain")

# A counted round: graph calls of `ROUND_STEPS` steps in all, fewer when one call alone
# lasts `ROUND_SECONDS` (a MiniLM step on 2 cores takes ~3 s: four would make every round 12 s).
ROUND_STEPS = 4
ROUND_SECONDS = 1.0


class Trial:
    """One candidate, built, compiled and warmed up: what `measurement.measure` times."""

    def __init__(self, task, config, strategy, candidate, iterator, batch_shape, planned_steps, initial):
        from amptrain.engine.build import build_training, seed
        from amptrain.tf_logs import expected_retracing

        trial = probe.apply(config, candidate)
        self.strategy, self.iterator, self.batch_shape = strategy, iterator, batch_shape
        self.spe = config.runtime.steps_per_execution
        began = time.perf_counter()
        seed(trial.runtime)
        self.model, _, _ = task.create_model(strategy, policy=candidate.policy)
        self.parts = build_training(
            self.model,
            task.loss,
            trial,
            strategy,
            candidate.policy,
            planned_steps,
            learning_rates=task.learning_rate_scales,
        )
        self.initial = initial.share(_state(self.model, self.parts))
        compiling = time.perf_counter()
        with expected_retracing():  # a trainer a candidate: each traces the same methods once
            self.parts.trainer.train(iterator, self.spe)
        first = time.perf_counter() - compiling
        ordinary = time.perf_counter()
        totals = self.parts.trainer.train(iterator, self.spe)
        now = time.perf_counter()
        self.compile_seconds = max(0.0, first - 2 * (now - ordinary))
        self.ready_seconds = now - began
        self.tokens_per_step = float(totals["tokens"][0]) / self.spe
        call = now - ordinary
        self.calls = max(1, min(-(-ROUND_STEPS // self.spe), int(-(-ROUND_SECONDS // call))))
        self.round_seconds = call * self.calls

    def round(self):
        """Tokens/s over one round's graph calls."""
        tokens, began = 0, time.perf_counter()
        for _ in range(self.calls):
            tokens += int(self.parts.trainer.train(self.iterator, self.spe)["tokens"][0])  # numpy: it has finished
        self.round_seconds = time.perf_counter() - began
        return tokens / self.round_seconds

    def rewind(self):
        """Every variable back to its value before the first step; False (and nothing
        changed) if a variable appeared since."""
        variables, values = _state(self.model, self.parts), self.initial.values()
        if [tuple(v.shape) for v in variables] != [value.shape for value in values]:
            return False
        for variable, value in zip(variables, values):
            variable.assign(value)
        return True

    def release(self):
        self.model = self.parts = self.iterator = self.initial = None


def _state(model, parts):
    """Every variable a training step changes or a run starts from, in a fixed order."""
    import tensorflow as tf

    found = list(model.variables) + list(parts.optimizer.variables)
    for value in parts.checkpoint_state().values():
        if isinstance(value, tf.Module):
            found += list(value.variables)
        elif value is not None:
            found.append(value)
    return found


class InitialState:
    """The trials' state before their first step, kept once: every candidate is built from
    the same seed with float32 variables, so their initial values are the same (checked by
    a digest; a candidate whose state differs keeps its own)."""

    def __init__(self):
        self.digest, self.saved = None, None

    def share(self, variables):
        values = [v.numpy() for v in variables]
        digest = hashlib.sha256()
        for value in values:
            digest.update(str((value.shape, value.dtype)).encode())
            digest.update(value.tobytes())
        if self.saved is None:
            self.digest, self.saved = digest.hexdigest(), values
            return self
        if digest.hexdigest() == self.digest:
            return self
        own = InitialState()
        own.digest, own.saved = digest.hexdigest(), values
        return own

    def values(self):
        return self.saved


class Winner:
    """The probe's winning trial, rewound to its initial state, until the run takes it
    (`decision.model_for_run`)."""

    def __init__(self, trial):
        self.model, self.parts, self.strategy = trial.model, trial.parts, trial.strategy

    def take(self, strategy):
        """(model, parts) if built under `strategy`, else None; either way, let go."""
        kept = (self.model, self.parts) if strategy is self.strategy and self.model is not None else None
        self.model = self.parts = None
        if kept is None:
            release(fresh_names=True)
        return kept


def measure_candidates(task, config, strategy, plan, progress=None):
    """(precision.measurement.Measurement, {Candidate: Trial still built}) for `plan`."""
    from amptrain.distribute import distribute_batches

    progress = progress or logger.info
    dataset, shape = task.probe_batches()
    iterator = iter(distribute_batches(strategy, lambda: dataset))
    progress(
        f"precision probe: up to {len(plan.order)} candidates ({', '.join(c.label() for c in plan.order)}) on "
        f"batches of {' x '.join(map(str, shape))}, within {SHARE:.0%} of the run's estimated time"
    )
    initial = InitialState()
    plan = dataclasses.replace(plan, shapes=len(task.train_buckets()))  # XLA compiles once a bucket

    def prepare(candidate):
        return Trial(task, config, strategy, candidate, iterator, shape, plan.planned_steps, initial)

    return measure(plan, prepare, progress=progress)


def release(trials=(), fresh_names=False):
    """Deletes `trials`, collects, and hands freed heap back to the system: glibc keeps
    it otherwise, and the process's RSS stays as high as the probe's peak. `fresh_names`:
    nothing of the probe is kept, so Keras's global state is reset too and the run's
    model is named as without a probe (never under a kept winner: it would lose its
    names' counters and policy state mid-run)."""
    for trial in list(trials):
        trial.release()
    if fresh_names:
        import keras

        keras.backend.clear_session()
    gc.collect()
    from amptrain.engine.utilisation import return_free_pages

    return_free_pages()
