"""`precision.policy = "auto"` and `runtime.jit_compile = "auto"`: chosen by measuring, within a budget.

Which precision and whether XLA pays differs by machine and by model: on a Xeon with AMX,
bf16 without XLA is the fastest and bf16 with XLA the slowest (XLA:CPU lowers bf16 matrix
products to float32 there); on a CPU without bf16 units half precision is emulated. So a
run whose policy or `jit_compile` is "auto" times a few compiled steps of its own model on
its own dominant batch shape under each candidate and trains with the shortest estimated
run. This module holds the decision's parts, none of which builds a model:

    plan, base = plan_for(config.precision, config.runtime, hardware, planned_steps)  # a Decision, or a Plan
    key = cache_key(hardware, config, batch_shape, plan.found)
    ProbeCache().read(key)                                   # a Measurement that covers the run, or None
    decision = conclude(plan, measured, "measured", base, key, path)

`decision.decide_precision` puts them together, once a run, with the
trials it builds (the rule's choice first, the others while the budget, 10% of the run,
covers them; a run too short to repay another candidate keeps the rule's). A `Decision` is
what `api` trains with (`apply`), the run folder keeps and the run record carries (`to_json`).
"""

import dataclasses
import hashlib
import json
import os

from amptrain.autoprecision.candidates import (  # noqa: F401 (the probe's vocabulary, imported from here)
    SHORT_NAMES,
    Candidate,
    can_pay,
    candidates,
    jit_mode,
    measuring_order,
    rule,
)
from amptrain.autoprecision.measurement import TIE, Measurement, Plan, speed
from amptrain.files import cache_dir
from amptrain.hardware.machine import Hardware  # noqa: F401 (the probe's vocabulary, imported from here)

RECORD_FILE = "precision.json"


@dataclasses.dataclass(frozen=True)
class Decision:
    """The run's precision decision. `source`: "run folder", "named", "rule" (the probe
    could not repay measuring more than the rule's choice), "cache" or "measured".
    `probe_seconds`: what this run spent measuring; `expected_saving_seconds`: the
    estimated run under the rule's choice minus under this one (None: not measured)."""

    policy: str
    jit_compile: bool | str
    source: str
    reason: str
    machine: dict = dataclasses.field(default_factory=dict)
    excluded: dict = dataclasses.field(default_factory=dict)
    planned_steps: int | None = None
    measurement: Measurement | None = None
    probe_seconds: float = 0.0
    expected_saving_seconds: float | None = None
    key: str | None = None
    cache: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "jit_compile", jit_mode(self.jit_compile))

    @property
    def candidate(self):
        return Candidate(self.policy, self.jit_compile)

    def to_json(self):
        data = {
            "policy": self.policy,
            "jit_compile": self.jit_compile,
            "source": self.source,
            "reason": self.reason,
            "probe_seconds": round(self.probe_seconds, 1),
            "expected_saving_seconds": _round1(self.expected_saving_seconds),
            "machine": self.machine,
            "excluded": self.excluded,
            "planned_steps": self.planned_steps,
        }
        if self.measurement is not None:
            data.update(self.measurement.to_json(), key=self.key, cache=self.cache)
        return data

    def run_fields(self):
        """What the `run` record of metrics.jsonl carries: the decision, and its cost and saving beside it."""
        data = self.to_json()
        return {k: data[k] for k in ("probe_seconds", "expected_saving_seconds")} | {"precision_choice": data}

    @classmethod
    def from_json(cls, data):
        measured = Measurement.from_json(data) if data.get("candidates") else None
        fields = {f.name for f in dataclasses.fields(cls)} - {"measurement"}
        return cls(**{k: v for k, v in data.items() if k in fields}, measurement=measured)


def _round1(value):
    return None if value is None else round(value, 1)


def plan_for(precision, runtime, hardware, planned_steps):
    """(Plan, what every decision records) when there is something to measure, else
    (the named `Decision`, None): one candidate is left. `precision`, `runtime`: the config's
    sections, all the plan reads."""
    found, excluded = candidates(precision, runtime, hardware)
    base = {"machine": hardware.describe(), "excluded": excluded, "planned_steps": planned_steps}
    if len(found) == 1:
        why = "named in the config" if precision.policy != "auto" else "the only candidate"
        return Decision(found[0].policy, found[0].jit_compile, "named", why, **base), None
    first, rule_why = rule(precision, runtime, hardware)
    order = measuring_order(found, first)
    return Plan(found, order, planned_steps, on_cpu=not hardware.accelerators(), rule_why=rule_why), base


def conclude(plan, measured, source, base, key, path):
    """The `Decision` from `measured`: the shortest estimated run among what was timed
    (the tie rule), the rule's choice when only it was timed, or the rule when nothing ran."""

    def estimate(c, tokens_per_second):
        return measured.run_seconds(c, tokens_per_second, plan.planned_steps)

    chosen, why = choose(measured.results, plan.found, estimate=estimate)
    first = plan.order[0]
    timed = set(measured.speeds())
    if chosen is None:  # nothing ran: the rule decides, and the run will say what fails
        chosen, why = first, f"{why}; {plan.rule_why}"
    elif timed == {first} and measured.not_tried:
        source = "rule" if source == "measured" else source
        why = f"{plan.rule_why}; the others not built ({next(iter(measured.not_tried.values()))})"
    speeds = measured.speeds()
    saving = None
    if first in speeds and chosen in speeds:
        saving = estimate(first, speeds[first]) - estimate(chosen, speeds[chosen])
    return Decision(
        chosen.policy, chosen.jit_compile, source, why, **base, measurement=measured,
        probe_seconds=measured.seconds if source in ("measured", "rule") else 0.0,
        expected_saving_seconds=saving, key=key, cache=path,
    )  # fmt: skip


def choose(results, order=None, estimate=None):
    """(Candidate or None, why) from {Candidate: [tokens/s of each round] or an error
    string}: the fastest (`measurement.speed`), or with `estimate(candidate, tokens/s) -> seconds`, the
    shortest estimated run; the earlier candidate in `order` (default: the dict's order)
    within `TIE` of it. None when every candidate failed."""
    order = list(order or results)
    speeds = {c: speed(v) for c, v in results.items() if not isinstance(v, str) and v}
    speeds = {c: m for c, m in speeds.items() if m > 0}
    if not speeds:
        return None, "every candidate failed"
    if estimate is None:
        score = {c: 1 / m for c, m in speeds.items()}  # lower is better
    else:
        score = {c: estimate(c, m) for c, m in speeds.items()}
    best = min(score, key=score.get)
    chosen = next(c for c in order if c in score and score[c] <= score[best] * (1 + TIE))
    runner_up = min((c for c in score if c != chosen), key=score.get, default=None)

    def shown(c):
        return f"{c.label()} {speeds[c]:,.0f} tokens/s" + (f", run ~{score[c]:,.0f} s" if estimate else "")

    what = "shortest estimated run" if estimate else "fastest measured"
    why = f"{what}: {shown(chosen)}"
    if chosen != best:
        why = f"{shown(chosen)}, within {TIE:.0%} of the best ({shown(best)}): the simpler wins a tie"
    elif runner_up is not None:
        why += f"; next {shown(runner_up)}"
    return chosen, why


def cache_key(hardware, config, batch_shape, found, model_identity=None):
    """A hash of what the measurement depends on: the machine, TensorFlow's version, the
    model and how it trains a step, the batch shape and the candidates. `model_identity`:
    what names a model that the config's `[model]` does not describe (a user's own,
    `Task.probe_identity`)."""
    import tensorflow as tf

    what = {
        "machine": hardware.describe(),
        "tensorflow": tf.__version__,
        "task": config.task,
        "model": dataclasses.asdict(config.model),
        "vocabulary_size": config.data.vocabulary_size,
        "batch_shape": list(batch_shape),
        "steps_per_execution": config.runtime.steps_per_execution,
        "accumulation_steps": config.train.accumulation_steps,
        "strategy": [config.runtime.strategy, config.runtime.devices, config.runtime.cpu_replicas],
        "candidates": [c.label() for c in found],
    }
    if model_identity is not None:
        what["model_identity"] = model_identity
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ProbeCache:
    """Measurements by cache key, one JSON file a key under `directory` (default:
    `cache_dir()/probe`, per user): a second run of the same model on the same machine
    decides without measuring."""

    def __init__(self, directory=None):
        self.directory = directory or os.path.join(cache_dir(), "probe")

    def path(self, key):
        return os.path.join(self.directory, f"{key}.json")

    def read(self, key):
        """The `Measurement` cached under `key`, or None (none, or unreadable)."""
        try:
            with open(self.path(key), encoding="utf-8") as f:
                return Measurement.from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, key, measured):
        write_record(self.path(key), {"key": key, **measured.to_json()})


def read_record(path):
    """The `Decision` saved at `path`, or None when there is none (or it is unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return Decision.from_json(record) if {"policy", "jit_compile", "source", "reason"} <= set(record) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(path, record):
    """Writes `record` (a `Decision` or a JSON-ready dict) to `path`, atomically."""
    from amptrain.files import atomic_write

    data = record.to_json() if isinstance(record, Decision) else record
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def apply(config, decision):
    """`config` with the decided policy and `jit_compile` (a `Decision` or `Candidate`) in
    place of "auto": the run's config, resolved once."""
    return dataclasses.replace(
        config,
        precision=dataclasses.replace(config.precision, policy=decision.policy),
        runtime=dataclasses.replace(config.runtime, jit_compile=jit_mode(decision.jit_compile)),
    )


def resolved_for(config, run_dir):
    """A saved run's config with its decision (`precision.json`) in place of "auto"; a run
    made before the probe existed gets the hardware rule."""
    decision = read_record(os.path.join(run_dir, RECORD_FILE))
    return apply(
        config, decision if decision is not None else rule(config.precision, config.runtime, Hardware.detect())[0]
    )


def summary(decision):
    """One line: every candidate's tokens/s, the choice, what the probe cost and what it
    expects to save, or why nothing was measured."""
    chosen = decision.candidate.label()
    measured = decision.measurement
    if measured is None:
        return f"precision {chosen} ({decision.source}: {decision.reason})"
    speeds = measured.speeds()
    shown = ", ".join(
        f"{c.label()} {speeds[c]:,.0f}" if c in speeds else f"{c.label()} failed" for c in measured.results
    )
    if measured.not_tried:
        shown += "; not built: " + ", ".join(c.label() for c in measured.not_tried)
    where = {"measured": f"measured in {decision.probe_seconds:.1f} s", "cache": "cached"}.get(
        decision.source, f"{decision.source}, measured in {decision.probe_seconds:.1f} s"
    )
    saving = decision.expected_saving_seconds
    expects = "" if saving is None else f"; expected saving ~{saving:,.0f} s"
    return f"precision probe ({where}{expects}), tokens/s: {shown} -> {chosen}: {decision.reason}"
