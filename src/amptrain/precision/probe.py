"""`precision.policy = "auto"` and `runtime.jit_compile = "auto"`: chosen by measuring.

Which precision and whether XLA pays differs by machine and by model: on a Xeon with AMX,
bf16 without XLA is the fastest and bf16 with XLA the slowest (XLA:CPU lowers bf16 matrix
products to float32 there); on a CPU without bf16 units half precision is emulated. So a
run whose policy or `jit_compile` is "auto" times a few compiled steps of its own model on
its own dominant batch shape under each candidate (`engine/probe_run.py`) and trains
with the fastest. This module holds everything but the timing:

    hardware = Hardware.detect()
    found = candidates(config, hardware)            # [Candidate], {excluded: why}
    choice, why = choose({c: [tokens/s, ...] or "error" for c in found[0]})
    record = decide(config, hardware, planned_steps, key, measure)   # cache, rule, or probe

The choice is cached per machine, model and batch shape (`cache_dir()`), written into the
run folder (`precision.json`, reused on resume) and skipped when the user names both the
policy and `jit_compile`, when only one candidate is left, or when the run is too short
to pay for the probe (`MIN_STEPS`; the hardware rule decides then).
"""

import dataclasses
import hashlib
import json
import os
import statistics

from amptrain.config.sections import CONCRETE_POLICIES

# A run shorter than this many steps is not worth probing: the hardware rule decides.
MIN_STEPS = 300
# Medians within this fraction of the fastest are a tie, won by the earlier candidate in
# `candidates`' order: float32 before bf16 before fp16, XLA off before on. Mixed precision
# and XLA must pay by more than the noise of a shared machine to be chosen.
TIE = 0.03
SHORT_NAMES = {"float32": "float32", "mixed_bfloat16": "bf16", "mixed_float16": "fp16"}
RECORD_FILE = "precision.json"


@dataclasses.dataclass(frozen=True)
class Candidate:
    policy: str
    jit_compile: bool | str  # True, False or "fusible" (xla_modes.py)

    def __post_init__(self):
        object.__setattr__(self, "jit_compile", jit_mode(self.jit_compile))

    def label(self):
        return SHORT_NAMES[self.policy] + {True: "+XLA", False: "", "fusible": "+fusible"}[self.jit_compile]


def jit_mode(value):
    """A recorded `jit_compile` as a mode: "fusible" stays, anything else is a bool."""
    return "fusible" if value == "fusible" else bool(value)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the candidates depend on: the accelerators (`policy.describe_devices`) and the
    CPU's flags, model name and core count."""

    devices: tuple = ()
    cpu_flags: frozenset = frozenset()
    cpu_model: str = ""
    cores: int = 0

    @classmethod
    def detect(cls):
        from amptrain.precision.policy import cpu_flags_from_proc, cpu_model_name, describe_devices

        return cls(tuple(describe_devices()), frozenset(cpu_flags_from_proc()), cpu_model_name(), os.cpu_count() or 0)

    def accelerators(self):
        return [d for d in self.devices if d["type"] in ("GPU", "TPU")]

    def describe(self):
        """The identity of the machine for the cache key and the record."""
        bf16 = sorted(self.cpu_flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16"})
        accelerators = [
            f"{d['type']} {d.get('device_name') or ''} {d.get('compute_capability') or ''}".strip()
            for d in self.accelerators()
        ]
        return {"cpu": self.cpu_model, "cores": self.cores, "cpu_flags": bf16, "accelerators": accelerators}


def can_pay(policy, hardware):
    """(True, "") if `policy` can be faster than float32 on `hardware`, else (False, why).
    fp16 never on a CPU (emulated; several times slower on these machines), bf16 on a CPU
    only with AVX512_BF16 or AMX."""
    if policy == "float32":
        return True, ""
    accelerators = hardware.accelerators()
    if any(d["type"] == "TPU" for d in accelerators):
        return (policy == "mixed_bfloat16"), "TPUs have no float16 matrix units"
    gpus = [d for d in accelerators if d["type"] == "GPU"]
    if gpus:
        capability = min(d.get("compute_capability") or (0, 0) for d in gpus)
        needed = (8, 0) if policy == "mixed_bfloat16" else (7, 0)
        return capability >= needed, f"GPU compute capability {capability[0]}.{capability[1]} < {needed[0]}.0"
    if policy == "mixed_float16":
        # AVX512_FP16 has float16 vector arithmetic, but TensorFlow's CPU matrix products in
        # float16 ran at float32's speed (358 against 358 GFLOP/s on an AMX Xeon)
        return False, "on a CPU TensorFlow's float16 matrix products are no faster than float32's"
    if hardware.cpu_flags & {"avx512_bf16", "amx_bf16"}:
        return True, ""
    return False, "CPU without AVX512_BF16 or AMX: bfloat16 is emulated"


def candidates(config, hardware):
    """([Candidate] in preference order, {label: why it is not tried})."""
    p, r = config.precision, config.runtime
    excluded = {}
    if p.policy != "auto":
        policies = [p.policy]
    else:
        policies = []
        for policy in CONCRETE_POLICIES:
            ok, why = can_pay(policy, hardware)
            if policy not in p.allow:
                excluded[SHORT_NAMES[policy]] = "not in precision.allow"
            elif not ok:
                excluded[SHORT_NAMES[policy]] = why
            else:
                policies.append(policy)
        if not policies:  # allow names only policies that cannot pay here: try them anyway
            policies = [q for q in CONCRETE_POLICIES if q in p.allow]
            excluded = {k: v for k, v in excluded.items() if v == "not in precision.allow"}
    if r.check_numerics:
        jits = [False]  # XLA cannot compile the check-numerics ops
    elif r.jit_compile == "auto":
        jits = [False, True]
    else:
        jits = [jit_mode(r.jit_compile)]
    found = [Candidate(policy, jit) for policy in policies for jit in jits]
    if r.jit_compile == "auto" and not r.check_numerics and not hardware.accelerators():
        # On a CPU, XLA turns bf16 and fp16 matrix products into float32 ones; "fusible"
        # keeps them oneDNN's and compiles what lies between (xla_modes.py).
        # Accelerators' XLA runs half-precision products as they are.
        found += [Candidate(policy, "fusible") for policy in policies if policy != "float32"]
    return found, excluded


def rule(config, hardware):
    """(Candidate, why) without measuring: the hardware rule (`policy.select_policy`)
    within `precision.allow`, and XLA on accelerators only. On a CPU XLA is off: its
    compilation does not pay on a short run, and on AMX it turns bf16 products into
    float32 ones."""
    from amptrain.precision.policy import select_policy

    p, r = config.precision, config.runtime
    if p.policy != "auto":
        policy, why = p.policy, "named in precision.policy"
    else:
        policy, why = select_policy("auto", list(hardware.devices), set(hardware.cpu_flags))
        if policy not in p.allow:
            policy = "float32" if "float32" in p.allow else p.allow[0]
            why += f"; not in precision.allow, so {policy}"
    if r.check_numerics:
        jit = False
    elif r.jit_compile == "auto":
        jit = bool(hardware.accelerators())
        why += "; XLA " + ("on: an accelerator" if jit else "off on a CPU")
    else:
        jit = jit_mode(r.jit_compile)
    return Candidate(policy, jit), why


@dataclasses.dataclass
class Measurement:
    """What the probe measured (`engine/probe_run.py`), cached as it is."""

    results: dict  # {Candidate: [tokens/s of each round] or an error string}
    compile_seconds: dict  # {Candidate: seconds of its first graph call, beyond its steps}
    seconds: float  # the whole probe
    batch_shape: tuple
    tokens_per_step: float  # real tokens a training step of that batch
    shapes: int  # batch shapes a run compiles under XLA (its buckets); 1 without XLA

    def to_json(self):
        return {
            "candidates": [
                {
                    "label": c.label(),
                    "policy": c.policy,
                    "jit_compile": c.jit_compile,
                    **_speeds(self.results[c]),
                    "compile_seconds": _round(self.compile_seconds.get(c)),
                }
                for c in self.results
            ],
            "probe_seconds": round(self.seconds, 1),
            "batch_shape": list(self.batch_shape),
            "tokens_per_step": self.tokens_per_step,
            "shapes": self.shapes,
        }

    @classmethod
    def from_json(cls, data):
        results, compiles = {}, {}
        for row in data["candidates"]:
            c = Candidate(row["policy"], row["jit_compile"])
            results[c] = row["error"] if row.get("error") else list(row["rounds"])
            if row.get("compile_seconds") is not None:
                compiles[c] = row["compile_seconds"]
        return cls(results, compiles, data["probe_seconds"], tuple(data["batch_shape"]), data["tokens_per_step"],
                   data["shapes"])  # fmt: skip

    def run_seconds(self, candidate, median, planned_steps):
        """The run's estimated time under `candidate`: its compilations (one a batch shape
        under XLA, one trace without) and `planned_steps` steps at its median speed."""
        compiles = self.shapes if candidate.jit_compile else 1
        return compiles * self.compile_seconds.get(candidate, 0.0) + planned_steps * self.tokens_per_step / median


def _speeds(result):
    if isinstance(result, str):
        return {"tokens_per_second": None, "error": result}
    return {"tokens_per_second": round(statistics.median(result), 1), "rounds": [round(v, 1) for v in result]}


def _round(value):
    return None if value is None else round(value, 2)


def choose(results, order=None, estimate=None):
    """(Candidate or None, why) from {Candidate: [tokens/s of each round] or an error
    string}: the fastest median, or with `estimate(candidate, median) -> seconds`, the
    shortest estimated run; the earlier candidate in `order` (default: the dict's order)
    within `TIE` of it. None when every candidate failed."""
    order = list(order or results)
    medians = {c: statistics.median(v) for c, v in results.items() if not isinstance(v, str) and v}
    medians = {c: m for c, m in medians.items() if m > 0}
    if not medians:
        return None, "every candidate failed"
    if estimate is None:
        score = {c: 1 / m for c, m in medians.items()}  # lower is better
    else:
        score = {c: estimate(c, m) for c, m in medians.items()}
    best = min(score, key=score.get)
    chosen = next(c for c in order if c in score and score[c] <= score[best] * (1 + TIE))
    runner_up = min((c for c in score if c != chosen), key=score.get, default=None)

    def shown(c):
        return f"{c.label()} {medians[c]:,.0f} tokens/s" + (f", run ~{score[c]:,.0f} s" if estimate else "")

    what = "shortest estimated run" if estimate else "fastest measured"
    why = f"{what}: {shown(chosen)}"
    if chosen != best:
        why = f"{shown(chosen)}, within {TIE:.0%} of the best ({shown(best)}): the simpler wins a tie"
    elif runner_up is not None:
        why += f"; next {shown(runner_up)}"
    return chosen, why


def cache_key(hardware, config, batch_shape, found):
    """A hash of what the measurement depends on: the machine, TensorFlow's version, the
    model and how it trains a step, the batch shape and the candidates."""
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
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_dir():
    """$AMPTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/amptrain, else ~/.cache/amptrain."""
    if os.environ.get("AMPTRAIN_CACHE_DIR"):
        return os.environ["AMPTRAIN_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "amptrain")


def read_record(path):
    """The decision saved at `path`, or None when there is none (or it is unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return record if {"policy", "jit_compile"} <= set(record) else None
    except (OSError, ValueError):
        return None


def write_record(path, record):
    from amptrain.files import atomic_write

    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps(record, indent=2) + "\n")


def decide(config, hardware, planned_steps, key_fn, measure, recorded=None):
    """The decision record for a run: `recorded` (the run folder's, on resume), else the
    one candidate there is, else the shortest estimated run by the cached measurement,
    else the hardware rule for a short run, else the shortest estimated run by a new
    measurement (`measure(candidates) -> Measurement`, then cached). The estimate counts the steps the
    run plans and its compilations (XLA compiles once a batch shape). `key_fn(found)` ->
    the cache key (it needs the batch shape, so it is only computed when needed)."""
    if recorded is not None:
        return {**recorded, "source": "run folder"}
    found, excluded = candidates(config, hardware)
    base = {"machine": hardware.describe(), "excluded": excluded}
    if len(found) == 1:
        c = found[0]
        why = "named in the config" if config.precision.policy != "auto" else "the only candidate"
        return {**base, "policy": c.policy, "jit_compile": c.jit_compile, "source": "named", "reason": why}
    key = key_fn(found)
    path = os.path.join(cache_dir(), "probe", f"{key}.json")
    source, measured = "cache", _read_measurement(path)
    if measured is None and planned_steps < MIN_STEPS:
        c, why = rule(config, hardware)
        why = f"{why} (a run of {planned_steps} steps is too short to pay for a probe; it measures from {MIN_STEPS})"
        return {**base, "policy": c.policy, "jit_compile": c.jit_compile, "source": "rule", "reason": why}
    if measured is None:
        source, measured = "measured", measure(found)
        write_record(path, {"key": key, **measured.to_json()})
    chosen, why = choose(
        measured.results, found, estimate=lambda c, median: measured.run_seconds(c, median, planned_steps)
    )
    if chosen is None:  # nothing ran: the rule decides, and the run will say what fails
        chosen, rule_why = rule(config, hardware)
        why = f"{why}; {rule_why}"
    return {
        **base,
        "policy": chosen.policy,
        "jit_compile": chosen.jit_compile,
        "source": source,
        "reason": why,
        "planned_steps": planned_steps,
        **measured.to_json(),
        "key": key,
        "cache": path,
    }


def _read_measurement(path):
    try:
        with open(path, encoding="utf-8") as f:
            return Measurement.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def apply(config, record):
    """`config` with the decided policy and `jit_compile` in place of "auto"."""
    return dataclasses.replace(
        config,
        precision=dataclasses.replace(config.precision, policy=record["policy"]),
        runtime=dataclasses.replace(config.runtime, jit_compile=jit_mode(record["jit_compile"])),
    )


def resolved_for(config, run_dir):
    """A saved run's config with its decision (`precision.json`) in place of "auto"; a run
    made before the probe existed gets the hardware rule."""
    record = read_record(os.path.join(run_dir, RECORD_FILE))
    if record is None:
        chosen, _ = rule(config, Hardware.detect())
        record = {"policy": chosen.policy, "jit_compile": chosen.jit_compile}
    return apply(config, record)


def summary(record):
    """One line: every candidate's tokens/s and the choice, or why nothing was measured."""
    chosen = Candidate(record["policy"], record["jit_compile"]).label()
    measured = record.get("candidates")
    if measured:
        shown = ", ".join(
            f"{c['label']} {c['tokens_per_second']:,.0f}" if c.get("tokens_per_second") else f"{c['label']} failed"
            for c in measured
        )
        where = {"measured": f"measured in {record.get('probe_seconds')} s", "cache": "cached"}.get(
            record["source"], f"from the {record['source']}"
        )
        return f"precision probe ({where}), tokens/s: {shown} -> {chosen}: {record['reason']}"
    return f"precision {chosen} ({record['source']}: {record['reason']})"
