"""`amptrain bench`: every combination of precision × XLA × steps per execution × batch
size, each measured in its own process, against the float32 / no-XLA / spe=1 row of the
same run.

    results = run_bench("configs/classify-spam.toml", [], Grid(precisions=("float32", "mixed_bfloat16")),
                        steps=30, repeats=3, data="real", out_dir="runs/classify-spam/bench")

MFU = training FLOPs per token (`hardware/flops.py`) × real tokens/s / the peak of the
precision in use: the data-sheet peak of a known GPU or TPU, else (a CPU) the FLOP/s of a
2048×2048 matrix product in the precision's compute dtype, measured in this run; at most
100% (a figure above means the peak was measured while the machine was busy). A model
whose FLOPs cannot be counted (a layer the count does not know) has `mfu` None: "-" in
the table, and `report.md` names the layers.
"""

import dataclasses
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile

from amptrain import forked, xla_modes
from amptrain.errors import UserError

logger = logging.getLogger("amptrain")

COMPUTE_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


@dataclasses.dataclass(frozen=True)
class Grid:
    precisions: tuple = ("float32", "mixed_bfloat16", "mixed_float16")
    jit: tuple = (False, True)
    steps_per_execution: tuple = (1, 20)
    batch_sizes: tuple = (None,)  # None: the config's train.batch_size

    def combinations(self):
        return list(itertools.product(self.precisions, self.jit, self.steps_per_execution, self.batch_sizes))


def preload():
    """What a measurement imports beyond TensorFlow and Keras (forked.IMPORTS), imported once
    by the bench before it forks its workers."""
    import amptrain.bench.worker  # noqa: F401
    import amptrain.engine.build  # noqa: F401
    import amptrain.tasks  # noqa: F401


def run_worker(spec, timeout=3600, fork=False):
    """Runs one measurement in a process of its own; returns its JSON result. `fork`: forked
    from this process (its import done, no TensorFlow runtime started: `forked.ready`)
    rather than a new Python; either way its runtime, XLA caches and peak are its own."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if fork:
        code, stdout, stderr = _forked_worker(spec, env, timeout)
    else:
        from amptrain.bench import worker  # a real import: the layout test sees what runs

        command = [sys.executable, "-m", worker.__name__, json.dumps(spec)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    lines = stdout.strip().splitlines()
    if code != 0 or not lines:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"benchmark worker failed ({spec.get('kind')}, exit {code}):\n{tail}")
    return json.loads(lines[-1])


def _forked_worker(spec, env, timeout):
    from amptrain.bench import worker

    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = forked.start(lambda: worker.main([json.dumps(spec)]), env, stdout.fileno(), stderr.fileno())
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        stdout.seek(0)
        stderr.seek(0)
        return code, stdout.read(), stderr.read()


def hardware_peaks(precisions, fork=False):
    """{precision: (peak FLOP/s, source)} for the first accelerator, or measured on the CPU.
    `fork`: the workers are forked, so this process must not list its devices (which starts
    CUDA): a worker lists them."""
    from amptrain.hardware.flops import peak_flops
    from amptrain.precision.policy import describe_devices

    devices = run_worker({"kind": "devices"}, fork=True)["devices"] if fork else describe_devices()
    name = devices[0].get("device_name") if devices else None
    peaks = {}
    for precision in precisions:
        known = peak_flops(precision, name)
        if known:
            peaks[precision] = known
            continue
        dtype = COMPUTE_DTYPES[precision]
        measured = run_worker({"kind": "peak", "dtype": dtype}, fork=fork)
        peaks[precision] = (
            measured["flops"],
            f"CPU: a {measured['size']}x{measured['size']} {dtype} matrix product, measured in this run",
        )
    return peaks


def measure_rows(config_path, overrides, grid, steps, repeats, data, progress=print, fork=False):
    from amptrain.engine.run_log import Pace

    rows = []
    combinations = grid.combinations()
    pace = Pace(len(combinations))
    for index, (precision, jit, spe, batch_size) in enumerate(combinations, 1):
        settings = [("precision.policy", precision), ("runtime.jit_compile", jit), ("runtime.steps_per_execution", spe)]
        if batch_size:
            settings.append(("train.batch_size", batch_size))
        spec = {
            "kind": "combination",
            "config": config_path,
            "overrides": [*overrides, *settings],
            "steps": steps,
            "repeats": repeats,
            "data": data,
        }
        progress(
            f"[{index}/{len(combinations)}] {precision}, XLA {xla_modes.describe(jit)}, "
            f"steps_per_execution {spe}"
            + (f", batch {batch_size}" if batch_size else "")
            + (f"  ({pace.describe(index - 1)})" if index > 1 else "")
        )
        result = run_worker(spec, fork=fork)
        rows.append(
            {"precision": precision, "jit": jit, "steps_per_execution": spe, "batch_size": batch_size, **result}
        )
    return rows


def add_ratios(rows, peaks, default_batch_size, tokens_per_batch=0):
    """MFU (real and padded tokens) and the speed-up against the float32 / no-XLA / spe=1
    row (of the same batch size); rows without such a baseline get None. Under
    `data.tokens_per_batch` a row's `batch_size` is None and `tokens_per_batch` says it."""
    for row in rows:
        if tokens_per_batch:
            row["batch_size"], row["tokens_per_batch"] = None, tokens_per_batch
        else:
            row["batch_size"] = row["batch_size"] or default_batch_size
        peak, source = peaks[row["precision"]]
        if not source.startswith("CPU") and row.get("num_replicas", 1) > 1:
            # A data-sheet peak is one accelerator's; logical CPU replicas share the measured CPU.
            peak, source = peak * row["num_replicas"], f"{row['num_replicas']} x {source}"
        row["peak_flops"], row["peak_source"] = peak, source
        flops = row.get("flops_per_token")  # None: the model's FLOPs cannot be counted, so MFU is unknown
        # never above 100%: a figure above means a peak measured low (the machine busy then)
        row["mfu"] = None if flops is None else min(1.0, flops * row["real_tokens_per_second"] / peak)
        row["mfu_padded"] = None if flops is None else min(1.0, flops * row["padded_tokens_per_second"] / peak)
        row["model_flops_per_second"] = None if flops is None else flops * row["real_tokens_per_second"]
    for row in rows:
        base = [
            b
            for b in rows
            if (b["precision"], b["jit"], b["steps_per_execution"], b["batch_size"])
            == ("float32", False, 1, row["batch_size"])
        ]
        row["speedup"] = row["real_tokens_per_second"] / base[0]["real_tokens_per_second"] if base else None
    return rows


def refuse_batch_sizes(config, option):
    """`--batch-sizes` and `--max-batch` set `train.batch_size`, which a config with
    `data.tokens_per_batch` ignores: they would time the same batches under other labels."""
    if config.data.tokens_per_batch:
        raise UserError(
            f"{option}: this config batches by tokens (data.tokens_per_batch = "
            f"{config.data.tokens_per_batch}), so train.batch_size, which {option} sets, is not used; "
            "vary the budget with --set data.tokens_per_batch=N instead"
        )


def run_bench(config_path, overrides, grid, steps, repeats, data, out_dir, progress=print):
    """Measures every combination and writes results.json, report.md and plots into `out_dir`."""
    from amptrain import config as config_lib
    from amptrain.bench import report

    config = config_lib.load_config(config_path, overrides)  # a config error stops us here
    if steps < 1 or repeats < 1:
        raise UserError(f"--steps and --repeats: expected integers >= 1, received {steps} and {repeats}")
    if grid.batch_sizes != (None,):
        refuse_batch_sizes(config, "--batch-sizes")
    from amptrain.bench.building import buildable_precisions

    usable = buildable_precisions(config, grid.precisions)
    if usable != tuple(grid.precisions):
        progress(f"left out {', '.join(p for p in grid.precisions if p not in usable)}: train.base_weights "
                 f"{config.train.base_weights} computes in float32 or bfloat16 only")  # fmt: skip
        grid = dataclasses.replace(grid, precisions=usable)
    os.makedirs(out_dir, exist_ok=True)
    # Each measurement in a process of its own: forked after the import where it can be
    # (forked.py), so only the first pays it; nothing here may list devices before the last.
    fork = forked.ready(preload)
    progress(f"each measurement in a process of its own, {'forked after the import' if fork else 'a new Python'}")
    progress("measuring the hardware peak")
    peaks = hardware_peaks(grid.precisions, fork)
    rows = add_ratios(
        measure_rows(config_path, overrides, grid, steps, repeats, data, progress, fork),
        peaks,
        config.train.batch_size,
        config.data.tokens_per_batch,
    )
    choice = auto_choice(config, rows)
    if choice:
        progress(choice)
    what = {"config": os.path.abspath(config_path), "overrides": list(overrides), "steps": steps, "repeats": repeats}
    results = results_record({**what, "data": data}, peaks, rows, choice)
    report.write_all(results, out_dir)
    return results


def results_record(what, peaks, rows, choice):
    """A bench's `results.json`: `what` was measured (config, overrides, steps, repeats,
    data, ...), the peaks (the float32 one first), the environment, the rows and auto's choice."""
    from amptrain.bench import report

    float32_peak = peaks.get("float32") or next(iter(peaks.values()))
    return {
        **what,
        "peak_flops": float32_peak[0],
        "peak_source": float32_peak[1],
        "peaks": {p: {"flops": f, "source": s} for p, (f, s) in peaks.items()},
        "environment": report.environment(),
        "rows": rows,
        "auto_choice": choice,
    }


def auto_choice(config, rows):
    """What `auto` would choose from this bench's rows (None when they hold no candidate):
    the precision probe's candidates for `config` on this machine (`autoprecision/probe.py`;
    a key the config names stays as named), compared at the config's batch size and the
    grid's steps per execution nearest the config's, by the probe's rule on tokens/s alone
    (a run's probe also weighs XLA's compilations, one a batch shape, against its steps)."""
    from amptrain.autoprecision import probe

    found, _ = probe.candidates(config.precision, config.runtime, probe.Hardware.detect())
    batch = config.train.batch_size if not config.data.tokens_per_batch else None
    usable = [r for r in rows if r["batch_size"] == batch or config.data.tokens_per_batch]
    if not usable:
        return None
    wanted = config.runtime.steps_per_execution
    spe = min({r["steps_per_execution"] for r in usable}, key=lambda n: (abs(n - wanted), n))
    speeds = {
        probe.Candidate(r["precision"], r["jit"]): [r["real_tokens_per_second"]]
        for r in usable
        if r["steps_per_execution"] == spe
    }
    measured = {c: speeds[c] for c in found if c in speeds}
    chosen, why = probe.choose(measured, found) if measured else (None, "")
    if chosen is None:
        return None
    missing = [c.label() for c in found if c not in speeds]
    return (
        f"by speed alone auto would choose {chosen.label()} ({why}; rows at steps_per_execution {spe}"
        + (f", config's {wanted}" if spe != wanted else "")
        + (f"; not in this grid: {', '.join(missing)}" if missing else "")
        + ")"
    )


def _trial(config_path, overrides, precision, jit, spe, batch, steps, memory_limit, tried, progress):
    """Whether a batch of `batch` rows fits: its peak (None: the run failed) into `tried`."""
    settings = [
        ("precision.policy", precision),
        ("runtime.jit_compile", jit),
        ("runtime.steps_per_execution", spe),
        ("train.batch_size", batch),
    ]
    spec = {
        "kind": "combination",
        "config": config_path,
        "overrides": [*overrides, *settings],
        "steps": steps,
        "repeats": 1,
        "data": "synthetic",
    }
    try:
        peak = run_worker(spec)["peak_memory_bytes"]
        why = ""
    except RuntimeError as error:  # out of memory on a device, or killed
        peak, why = None, " (" + str(error).strip().splitlines()[-1][:200] + ")"
    tried[batch] = peak
    ok = peak is not None and (memory_limit is None or peak <= memory_limit)
    progress(
        f"  {precision}: batch {batch} "
        + (f"peak {peak / 2**20:,.0f} MiB" if peak else "failed" + why)
        + (" fits" if ok else " does not fit")
    )
    return ok


def find_max_batch(
    config_path,
    overrides,
    precision,
    jit,
    spe,
    memory_limit,
    start,
    progress=print,
    steps=1,
    resolution=1 / 16,
    growth=2.0,
):
    """The largest batch (a multiple of 8) whose run fits: the worker succeeds and, on a
    CPU, its peak resident memory stays under `memory_limit`. From `start` (the estimate's
    largest batch, with `growth` 1.125; else the grid's, doubling), growing or shrinking by
    `growth` until one fits and the next does not, then bisection down to 8 rows or
    `resolution` of the batch, whichever is coarser (each trial compiles and runs a few steps
    at that batch: at thousands of rows on a CPU a trial takes minutes; one timed step after
    the first call is enough, as the first step sets the peak). Returns (largest fitting
    batch or None, {batch: peak bytes or None})."""
    tried = {}

    def fits(batch):
        return _trial(config_path, overrides, precision, jit, spe, batch, steps, memory_limit, tried, progress)

    def scaled(batch, factor):
        return max(8, int(batch * factor) // 8 * 8)

    low, high = None, max(8, start - start % 8)
    while fits(high):  # up while it fits
        low, high = high, max(scaled(high, growth), high + 8)
        if high > 2**16:
            return low, tried
    while low is None and high > 8:  # down until one fits (when `start` did not)
        candidate = min(scaled(high, 1 / growth), high - 8)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    if low is None:
        return None, tried
    while high - low > max(8, low * resolution):
        middle = (low + high) // 2 // 8 * 8
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, tried
