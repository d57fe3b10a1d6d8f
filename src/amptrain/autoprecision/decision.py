"""`precision.policy = "auto"` and `runtime.jit_compile = "auto"` decided once a run, in one
function that reads top to bottom:

    decision, winner = decide_precision(task, config, ProbeCache(), strategy, recorded)
    model, policy, parts = model_for_run(task, strategy, decision, winner)

1. `recorded`: the run folder's decision (`precision.json`, on resume), else
2. named: one candidate is left (`precision.candidates`), else
3. the cache (`autoprecision.probe.ProbeCache`: per machine, model and batch shape), else
4. measured here: `trials.measure_candidates` builds and times the candidates the
   plan orders, within its budget (`autoprecision/measurement.py`);
then `probe.conclude`: the shortest estimated run (the tie rule), what the probe cost and
what it expects to save against the hardware rule.

The `Decision` is frozen: what `api` trains with (`probe.apply`), the run folder keeps and
the run record carries. The winner, when it was measured here, is its trial rewound to its
initial state, which the run trains instead of building and compiling the same model again.
It is not kept under check-numerics (the checks are added when a step is traced), and the
run builds afresh when it trains under another strategy than the probe measured with (the
chief of several workers measures on its own device).
"""

import dataclasses

from amptrain.autoprecision import probe
from amptrain.autoprecision.trials import Winner, measure_candidates, release


def decide_precision(task, config, cache, strategy, recorded=None, hardware=None, measure=None):
    """(the run's `probe.Decision`, the `Winner` to train or None). `cache`: a
    `probe.ProbeCache`; `strategy`: what the candidates are measured under; `hardware`: the
    machine (default: this one); `measure(plan) -> (Measurement, {Candidate: trial})`:
    default, the task's candidates built and timed here."""
    if recorded is not None:
        return dataclasses.replace(recorded, source="run folder"), None
    hardware = hardware or probe.Hardware.detect()
    planned = config.train.total_steps(max(1, task.steps_per_epoch // config.train.accumulation_steps))
    plan, base = probe.plan_for(config.precision, config.runtime, hardware, planned)
    if isinstance(plan, probe.Decision):
        return plan, None
    key = probe.cache_key(hardware, config, task.probe_batches()[1], plan.found, task.probe_identity())
    measured = cache.read(key)
    if measured is not None and measured.covers(planned):
        return probe.conclude(plan, measured, "cache", base, key, cache.path(key)), None
    if measure is None:
        measured, trials = measure_candidates(task, config, strategy, plan)
    else:
        measured, trials = measure(plan)
    if measured.speeds():  # a failure is not cached: the corrected run measures again
        cache.write(key, measured)
    decision = probe.conclude(plan, measured, "measured", base, key, cache.path(key))
    return decision, _keep_winner(trials, decision, config)


def _keep_winner(trials, decision, config):
    """The decided candidate's trial rewound for the run, or None; the others released."""
    trials = dict(trials)
    winner = trials.pop(decision.candidate, None)
    keep = winner is not None and not config.runtime.check_numerics and winner.rewind()
    if not trials and winner is None:  # nothing was built here
        return None
    dropped = [*trials.values(), *([winner] if winner is not None and not keep else [])]
    release(dropped, fresh_names=not keep)
    if not keep:
        return None
    kept = Winner(winner)
    winner.release()  # and with it the copy of its initial state: its variables hold it now
    release()
    return kept


def model_for_run(task, strategy, decision, winner=None):
    """(model, policy, training parts or None): the probe's winner if it was kept for
    `strategy`, else the model built afresh from the run's seed (`engine.build.seed`)."""
    from amptrain.engine.build import seed

    kept = winner.take(strategy) if winner is not None else None
    if kept is not None:
        return kept[0], decision.policy, kept[1]
    seed(task.config.runtime)
    model, policy, _ = task.create_model(strategy)
    return model, policy, None
