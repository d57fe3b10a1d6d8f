"""`amptrain bench` of a model that lives in this process: your own, through `amptrain.Trainer`.

    results = trainer.bench(precisions=("float32", "mixed_bfloat16"), jit=(False, True),
                            steps_per_execution=(1, 20), steps=30, repeats=3)
    results["rows"]          # one a combination, the columns of `amptrain bench CONFIG`
    # runs/mine/bench/{results.json, report.md, throughput.png, memory.png}

The same grid, timing, MFU, speed-ups, report and plots as `amptrain bench CONFIG`
(`runner.py`, `worker.py`, `report.py`), with one difference: a config's bench starts a
process a combination, but your builder and datasets are Python objects of this process, so
here the combinations run one after another in it. Each is built afresh from your builder
under its policy (the way `fit` builds it: `building.build_trainer`), timed, then deleted and
its memory returned (`autoprecision.trials.release`). Peak memory is the process's peak
resident set during the combination: Linux's high-water mark is reset before each
(`/proc/self/clear_refs`); where it cannot be reset, the column is left empty.
"""

import dataclasses
import logging
import os
import tempfile

from amptrain import xla_modes
from amptrain.bench import runner
from amptrain.errors import UserError

logger = logging.getLogger("amptrain")

ISOLATION = "the combinations one after another in this process (your model and data live in it), each built afresh"
CLEAR_REFS = "/proc/self/clear_refs"


def bench_in_process(make_task, config, grid, steps, repeats, out_dir, description, progress=None):
    """Measures every combination of `grid` on the task `make_task(config, run_dir)` builds
    and writes results.json, report.md and plots into `out_dir`; returns the results."""
    from amptrain.bench import report
    from amptrain.engine.run_log import Pace

    progress = progress or logger.info
    if steps < 1 or repeats < 1:
        raise UserError(f"steps and repeats: expected integers >= 1, received {steps} and {repeats}")
    if grid.batch_sizes != (None,):
        raise UserError("batch_sizes: your own model's batches are your data's; bench them at the size they have")
    os.makedirs(out_dir, exist_ok=True)
    progress("measuring the hardware peak")
    peaks = runner.hardware_peaks(grid.precisions)
    combinations = grid.combinations()
    pace, rows = Pace(len(combinations)), []
    for index, (precision, jit, spe, _) in enumerate(combinations, 1):
        progress(
            f"[{index}/{len(combinations)}] {precision}, XLA {xla_modes.describe(jit)}, steps_per_execution {spe}"
            + (f"  ({pace.describe(index - 1)})" if index > 1 else "")
        )
        cell = _with(config, precision, jit, spe)
        row = {"precision": precision, "jit": jit, "steps_per_execution": spe, "batch_size": None}
        rows.append({**row, **measure(make_task, cell, steps, repeats)})
    rows = runner.add_ratios(rows, peaks, config.train.batch_size)
    choice = runner.auto_choice(config, rows)
    if choice:
        progress(choice)
    what = {"config": description, "overrides": [], "steps": steps, "repeats": repeats, "data": "real"}
    results = runner.results_record({**what, "isolation": ISOLATION}, peaks, rows, choice)
    report.write_all(results, out_dir)
    return results


def measure(make_task, config, steps, repeats):
    """One combination's row (the keys of `worker.measure_combination`'s); what it built is
    deleted and its memory returned before the next."""
    from amptrain.autoprecision.trials import release
    from amptrain.engine.utilisation import resident_memory

    reset = _reset_peak_memory()
    with tempfile.TemporaryDirectory(prefix="amptrain-bench-") as scratch:
        row = _timed(make_task(config, scratch), config, steps, repeats)  # its data hash goes to scratch
    release(fresh_names=True)  # the combination's model, optimizer and compiled steps are gone with `_timed`
    row["peak_memory_bytes"] = resident_memory()[1] if reset else None  # VmHWM
    row["peak_memory_source"] = (
        "process peak RSS during the combination (high-water mark reset before it)"
        if reset
        else "not measured (the peak RSS cannot be reset here)"
    )
    return row


def _timed(task, config, steps, repeats):
    from amptrain import distribute
    from amptrain.bench.building import build_trainer
    from amptrain.bench.worker import _time_steps, timed_row

    task.prepare(("train",))
    placement = distribute.select_strategy(config.runtime)
    task, model, trainer, policy = build_trainer(config, placement.strategy, task=task)
    dataset = task.train_dataset(0)
    iterator = iter(distribute.distribute_batches(trainer.strategy, lambda: dataset))
    spe = config.runtime.steps_per_execution
    warmup = max(spe, 48)  # as a config's bench on real data
    timing = _time_steps(trainer, iterator, spe, warmup, steps, repeats)
    return timed_row(timing, model, trainer, policy, placement.name)


def _with(config, precision, jit, spe):
    runtime = dataclasses.replace(config.runtime, jit_compile=jit, steps_per_execution=spe)
    return dataclasses.replace(
        config, precision=dataclasses.replace(config.precision, policy=precision), runtime=runtime
    )


def _reset_peak_memory():
    """Resets this process's peak resident set (VmHWM) to its current size; False where the
    kernel does not let us (not Linux, or an old kernel)."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
