"""What a config's training needs in memory, per precision, before it trains: `amptrain doctor
--memory CONFIG` and `Trainer.memory` print it, and `amptrain bench --max-batch` starts its
search from it (`engine/memory.py` counts).

    plans = plan_config("configs/classify-spam.toml", ["model.remat=blocks"], budget=4 * 2**30)
    print(format_plans(plans))

Each precision's model and training parts are built as `amptrain fit` builds them
(`bench.building.build_trainer`) and the step traced, never run: a few seconds a precision.
"""

import json
import math

from amptrain import config as config_lib
from amptrain.engine import memory
from amptrain.errors import UserError

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


def parse_memory(text):
    """`8GiB`, `512MiB`, `2G`, `1500000000` -> bytes; above 0, at most 256 TiB (no machine's
    memory is outside that: 0, -5, inf or 1e30 is a mistake, refused in one line)."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    cleaned = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        scale = units[cleaned[-1]] if cleaned and cleaned[-1] in units else 1
        value = float(cleaned[:-1] if scale > 1 else cleaned) * scale
    except ValueError:
        value = math.nan
    if not MEMORY_LIMITS[0] <= value <= MEMORY_LIMITS[1]:  # NaN fails too
        raise UserError(
            f"--memory-limit: expected a size above 0 and up to 256TiB, such as 8GiB or 512MiB, received {text!r}"
        )
    return int(value)


MEMORY_LIMITS = (1, 2**48)


def rows_and_length(config):
    """(rows a batch, positions a row) of `config`'s training batches: `data.tokens_per_batch`
    over `data.max_length` rows when it batches by tokens."""
    d = config.data
    rows = d.tokens_per_batch // d.max_length if d.tokens_per_batch else config.train.batch_size
    return rows, d.max_length


def with_precision(config, policy):
    """`config` under `policy` with XLA off: the estimate counts what the graph shows (XLA plans
    its own buffers, usually fewer)."""
    import dataclasses

    return dataclasses.replace(
        config,
        precision=dataclasses.replace(config.precision, policy=policy),
        runtime=dataclasses.replace(config.runtime, jit_compile=False),
    )


def estimate(config, make_task=None, runtime=None, run_step=True):
    """The `memory.Estimate` of `config`'s training step; `make_task(config)` builds the task
    (a `Trainer`'s), else the config's own. `runtime`: an earlier estimate whose runtime this
    one takes (its step and an evaluation's functions are then not run again); else it is
    measured here, with the step run once when `run_step` (`memory.estimate_step`), and so is
    what an evaluation's functions keep (`Task.warm_up_evaluation`)."""
    import keras

    from amptrain.bench.building import build_trainer

    keras.backend.clear_session()
    task = make_task(config) if make_task is not None else None
    if task is not None:
        task.prepare(("train",))
    task, model, trainer, policy = build_trainer(config, task=task)
    found = memory.estimate_step(
        trainer,
        model,
        task.signature(),
        config.data.max_length,
        policy,
        trainer.optimizer,
        trainer.weight_average,
        run_step=run_step and runtime is None,
    )
    found.evaluation = task.evaluation_memory(model)
    if runtime is not None:
        found.fixed, found.function_measured = runtime.fixed, runtime.function_measured
        if found.evaluation:
            found.evaluation["functions"] = runtime.evaluation.get("functions", 0)
    elif found.evaluation and run_step:  # the generation's function made once, measured
        found.evaluation["functions"] = memory.runtime_growth(lambda: task.warm_up_evaluation(model))
    return found


def plan(config, precisions=PRECISIONS, budget=None, make_task=None, run_step=True):
    """[record] a precision: the estimate's parts, its total at the config's batch, and the
    largest batch under `budget` (bytes) when given. `run_step` False: a user's built model,
    whose state (a norm's statistics, dropout's seeds) one step would move."""
    rows, length = rows_and_length(config)
    plans, first = [], None
    for policy in precisions:
        found = estimate(with_precision(config, policy), make_task, first, run_step)
        first = first or found  # the runtime once: a later build leaves the earlier's garbage behind
        plans.append({**found.as_record(rows, budget), "positions_per_row": length, "remat": config.model.remat})
    return plans


def plan_config(path, overrides=(), precisions=PRECISIONS, budget=None):
    """`plan` of the config at `path` with `overrides`."""
    from amptrain import distribute

    config = config_lib.load_config(path, overrides)
    distribute.configure_devices(config.runtime)
    from amptrain.bench.building import buildable_precisions

    return plan(config, buildable_precisions(config, precisions), budget)


def total_at(record, batch_size):
    """The total bytes a record of `plan` estimates at `batch_size` rows."""
    fixed = record["total_bytes"] - record["batch_size"] * record["activations_bytes_per_row"]
    return round(fixed + batch_size * record["activations_bytes_per_row"])


def plan_yours(config, built, precisions, memory_limit, make_task):
    """`Trainer.memory`: `plan` of a user's model (`make_task(config, run_dir)`, a `Trainer`'s
    task); `built`: a built model, which has one precision, its own."""
    import tempfile

    named = config.precision.policy != "auto"
    if precisions is None:
        precisions = (config.precision.policy,) if named else PRECISIONS
    if built and set(precisions) != {config.precision.policy}:
        raise UserError("memory: a built model has one precision, its own; pass a builder to compare")
    budget = parse_memory(memory_limit) if isinstance(memory_limit, str) else memory_limit
    scratch = tempfile.mkdtemp(prefix="amptrain-memory-")
    return plan(config, tuple(precisions), budget, make_task=lambda c: make_task(c, scratch), run_step=not built)


def doctor_memory(path, overrides, memory_limit, as_json):
    """`amptrain doctor --memory PATH`: prints each precision's estimate (a table, or JSON)."""
    budget = parse_memory(memory_limit) if memory_limit else None
    plans = plan_config(path, overrides, budget=budget)
    print(json.dumps(plans, indent=2) if as_json else format_plans(plans))
    return 0


def _mib(value):
    return f"{value / 2**20:,.0f}"


def _share(plan):
    """The share of the parameters trained (LoRA: the adapters'), as a percentage."""
    return f"{100 * plan['trainable_parameters'] / max(plan['parameters'], 1):.1f}%"


def format_plans(plans):
    """The terminal table of `plan_config`'s records."""
    first = plans[0]
    budget = first.get("memory_limit_bytes")
    lines = [
        f"memory a training step needs, estimated from the model (model.remat = {first['remat']!r}, "
        f"{first['positions_per_row']} positions a row; MiB)",
        "precision        params  trained  weights  gradients  slots  runtime  a row (kept)   "
        + f"batch {first['batch_size']}"
        + ("  largest batch" if budget else ""),
    ]
    for p in plans:
        row = (
            f"{p['policy']:<15} {p['parameters'] / 1e6:6.1f}M {_share(p):>8} {_mib(p['weights_bytes']):>8} "
            f"{_mib(p['gradients_bytes']):>10} {_mib(p['optimizer_slots_bytes']):>6} {_mib(p['runtime_bytes']):>8} "
            f"{p['activations_bytes_per_row'] / 2**20:6.2f} ({p['kept_for_backward_bytes_per_row'] / 2**20:.2f}) "
            f"{_mib(p['total_bytes']):>10}"
        )
        lines.append(row + (f"  {p['largest_batch']:>13,}" if budget else ""))
    for p in plans:  # a frozen base held otherwise than its adapters (train.base_weights), or LoRA
        by_dtype = p.get("weights_bytes_by_dtype") or {}
        if len(by_dtype) > 1 or p.get("trainable_weights_bytes", p["weights_bytes"]) < p["weights_bytes"]:
            held = ", ".join(f"{dtype} {_mib(size)}" for dtype, size in by_dtype.items())
            lines.append(f"{p['policy']} weights: {held}; trained (adapters) {_mib(p['trainable_weights_bytes'])}")
    for p in plans:  # an evaluation that holds more than the model (a chat run's generated replies)
        if p.get("evaluation_bytes"):
            parts = ", ".join(f"{part.replace('_', ' ')} {_mib(size)}" for part, size in p["evaluation_bytes"].items())
            lines.append(
                f"{p['policy']} evaluation: {parts} beside the weights and runtime; "
                f"the run's peak {_mib(p['run_total_bytes'])}"
            )
    lines.append(
        "a row: the step's peak of tensors alive a row of the batch, (kept) of which the forward pass "
        "keeps for the backward; runtime: TensorFlow's own, measured in this process with the step made"
    )
    if budget:
        lines.append(f"largest batch: a multiple of 8 under --memory-limit {budget / 2**30:.2f} GiB")
    if first["remat"] == "none":
        lines.append("less a row: --set model.remat=blocks recomputes each block in the backward pass")
    return "\n".join(lines)
