"""The precision probe's measurement, within a budget: which candidates are built, in what
order, for how many rounds, and what it found (`Measurement`, cached as it is).

    plan = Plan(found, order, planned_steps=456, shapes=6, on_cpu=True)
    measured, trials = measure(plan, prepare)    # prepare(candidate) -> a ready Trial
    measured.results       # {Candidate: [tokens/s of each round] or "error text"}
    measured.not_tried     # {Candidate: why it was not built}

`prepare` builds, compiles and warms up a candidate (`autoprecision/trials.py` does it for
real; the tests pass fakes with a fake clock). The budget: the probe spends at most
`SHARE` of the run it decides for, estimated from the first candidate's speed and the
planned steps, and at least `FLOOR_SECONDS`; it counts from the first candidate ready,
since that one is the rule's choice, which the run would build and compile anyway
(`autoprecision/decision.py` hands it to the run when it wins). A candidate is not built when the
budget cannot cover it, or when the timings so far make it hopeless (`Budget.verdict`).
"""

import dataclasses
import time

from amptrain.autoprecision.candidates import Candidate

SHARE = 0.10
FLOOR_SECONDS = 5.0
# A candidate with XLA compiles about twice as long as its graph without: 9.7 against
# 5.2 s (float32) and 10.2 against 5.0 s (bf16) for `make demo`'s model.
XLA_COMPILE_FACTOR = 2.0
# XLA (whole or fusible) has made a step at most ~1.1x faster than the same policy without
# it on the CPUs measured (make demo: 81,402 against 79,035 tokens/s); 1.5 leaves room.
MAX_XLA_GAIN = 1.5
# The most another candidate has sped a step up over the rule's choice: bf16 over float32
# on an AMX Xeon, ~2.5x at the spam config's shape. A candidate that would not repay its
# cost even at this speed-up is not built.
MAX_SPEEDUP = 3.0
ROUNDS = 3  # counted rounds at most, the first right after a candidate's uncounted call


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to measure: `found` in preference order (the tie rule's), `order` the building
    order (`candidates.measuring_order`), the run's planned steps and its batch shapes
    (XLA compiles once a shape), and whether the devices are CPUs (XLA:CPU turns bf16
    matrix products into float32 ones)."""

    found: list
    order: list
    planned_steps: int
    shapes: int = 1
    on_cpu: bool = True
    rule_why: str = ""


@dataclasses.dataclass
class Measurement:
    """What the probe measured, cached as it is."""

    results: dict  # {Candidate: [tokens/s of each round] or an error string}
    compile_seconds: dict  # {Candidate: seconds of its first graph call, beyond its steps}
    seconds: float  # the whole measurement
    batch_shape: tuple
    tokens_per_step: float  # real tokens a training step of that batch
    shapes: int  # batch shapes a run compiles under XLA (its buckets); 1 without XLA
    not_tried: dict = dataclasses.field(default_factory=dict)  # {Candidate: why it was not built}
    budget_seconds: float = 0.0

    def to_json(self):
        rows = [
            {
                "label": c.label(),
                "policy": c.policy,
                "jit_compile": c.jit_compile,
                **_speeds(self.results[c]),
                "compile_seconds": _round(self.compile_seconds.get(c)),
            }
            for c in self.results
        ]
        rows += [
            {"label": c.label(), "policy": c.policy, "jit_compile": c.jit_compile, "tokens_per_second": None,
             "not_tried": why}
            for c, why in self.not_tried.items()
        ]  # fmt: skip
        return {
            "candidates": rows,
            "measured_seconds": round(self.seconds, 1),
            "budget_seconds": round(self.budget_seconds, 1),
            "batch_shape": list(self.batch_shape),
            "tokens_per_step": self.tokens_per_step,
            "shapes": self.shapes,
        }

    @classmethod
    def from_json(cls, data):
        results, compiles, not_tried = {}, {}, {}
        for row in data["candidates"]:
            c = Candidate(row["policy"], row["jit_compile"])
            if row.get("not_tried"):
                not_tried[c] = row["not_tried"]
                continue
            results[c] = row["error"] if row.get("error") else list(row["rounds"])
            if row.get("compile_seconds") is not None:
                compiles[c] = row["compile_seconds"]
        return cls(results, compiles, data["measured_seconds"], tuple(data["batch_shape"]), data["tokens_per_step"],
                   data["shapes"], not_tried, data["budget_seconds"])  # fmt: skip

    def speeds(self):
        """{Candidate: its `speed`} of those that ran."""
        return {c: speed(v) for c, v in self.results.items() if not isinstance(v, str) and v}

    def run_seconds(self, candidate, tokens_per_second, planned_steps):
        """The run's estimated time under `candidate`: its compilations (one a batch shape
        under XLA, one trace without) and `planned_steps` steps at its `speed`."""
        return run_estimate(candidate, tokens_per_second, self.compile_seconds.get(candidate, 0.0), self.shapes,
                            planned_steps * self.tokens_per_step)  # fmt: skip

    def covers(self, planned_steps):
        """True when this measurement is as complete as a new one for a run of
        `planned_steps` would be: it left nothing out, or that run's budget is no larger."""
        speeds = self.speeds()
        if not self.not_tried or not speeds:
            return True
        best = min(self.run_seconds(c, v, planned_steps) for c, v in speeds.items())
        return budget_seconds(best) <= self.budget_seconds * 1.25


def _speeds(result):
    if isinstance(result, str):
        return {"tokens_per_second": None, "error": result}
    return {"tokens_per_second": round(speed(result), 1), "rounds": [round(v, 1) for v in result]}


def _round(value):
    return None if value is None else round(value, 2)


def speed(rounds):
    """A candidate's tokens/s from its rounds: the best one. On a shared machine another
    process only ever slows a round (as `timeit` advises, the fastest is the most
    telling): the seed-recipe shape measured bf16 4,446 then 2,217 tokens/s in two rounds
    while float32 ran 3,180 and 3,627, and their medians chose float32."""
    return max(rounds)


# Medians within this fraction of the fastest are a tie, won by the earlier candidate in
# `candidates`' order: float32 before bf16 before fp16, XLA off before on. Mixed precision
# and XLA must pay by more than the noise of a shared machine to be chosen (`probe.choose`).
TIE = 0.03


def run_estimate(candidate, tokens_per_second, compile_seconds, shapes, tokens):
    """Seconds of a run of `tokens` under `candidate`: one compilation a batch shape under
    XLA (one trace without) and its steps at `tokens_per_second`."""
    return (shapes if candidate.jit_compile else 1) * compile_seconds + tokens / tokens_per_second


def budget_seconds(run_seconds):
    return max(FLOOR_SECONDS, SHARE * run_seconds)


class Budget:
    """The probe's spending limit and its verdict on the next candidate. `started`: when
    the first candidate was ready; `seconds`, `run_seconds`: set by `start`."""

    def __init__(self, plan, clock):
        self.plan, self.clock = plan, clock
        self.started, self.seconds, self.run_seconds, self.tokens_per_step = None, FLOOR_SECONDS, None, 0.0
        self.ready = {}  # {Candidate: seconds its building, compiling and warm-up took}
        self.round_seconds = 0.0  # the longest round seen

    def start(self, candidate, tokens_per_step, speed):
        self.started, self.tokens_per_step = self.clock(), tokens_per_step
        self.run_seconds = self.ready[candidate] + self.plan.planned_steps * tokens_per_step / speed
        self.seconds = budget_seconds(self.run_seconds)

    def spent(self):
        return self.clock() - self.started

    def ready_estimate(self, candidate):
        """Seconds to build and warm up `candidate`: the slowest of its kind (XLA or not)
        so far, else the first candidate's, doubled for XLA."""
        same = [s for c, s in self.ready.items() if bool(c.jit_compile) == bool(candidate.jit_compile)]
        if same:
            return max(same)
        return max(self.ready.values()) * (XLA_COMPILE_FACTOR if candidate.jit_compile else 1.0)

    def verdict(self, candidate, speeds):
        """Why `candidate` is not built (None: build it). `speeds`: {Candidate: tokens/s} so far."""
        ready = self.ready_estimate(candidate)
        best = max(speeds.values())
        cost = ready + 2 * self.round_seconds
        steps = self.plan.planned_steps * self.tokens_per_step
        if cost > steps / best * (1 - 1 / MAX_SPEEDUP):
            return (
                f"cannot repay: building and timing it (~{cost:,.0f} s) costs more than it could save "
                f"on a run of ~{steps / best:,.0f} s of steps"
            )
        bound = self._bound(candidate, speeds)
        if bound is not None:
            compiles = self.plan.shapes if candidate.jit_compile else 1
            at_best = min(self.ready_estimate(c) + steps / s for c, s in speeds.items())
            at_most = compiles * ready + steps / bound
            if at_most >= at_best:
                return (
                    f"hopeless: at most {bound:,.0f} tokens/s against {best:,.0f} measured, "
                    f"a run of at least ~{at_most:,.0f} s against ~{at_best:,.0f} s"
                )
        if self.spent() + cost > self.seconds:
            return (
                f"not tried: the budget ({self.seconds:,.0f} s, {SHARE:.0%} of the ~{self.run_seconds:,.0f} s run) "
                f"cannot cover it (~{cost:,.0f} s, {self.spent():,.0f} s spent)"
            )
        return None

    def _bound(self, candidate, speeds):
        """The most tokens/s `candidate` can reach given its policy's speed without XLA, or
        None if that is not measured. Whole XLA on a CPU runs bf16 and fp16 products as
        float32 ones, so its bound is float32's."""
        if not candidate.jit_compile:
            return None
        base = candidate.policy
        if candidate.jit_compile is True and self.plan.on_cpu:
            base = "float32"
        speed = speeds.get(Candidate(base, False))
        return None if speed is None else speed * MAX_XLA_GAIN


def measure(plan, prepare, clock=time.perf_counter, progress=lambda line: None):
    """(Measurement, {Candidate: Trial still built}). `prepare(candidate)` -> a Trial with
    `ready_seconds`, `compile_seconds`, `tokens_per_step`, `batch_shape`, `round_seconds`,
    `round() -> tokens/s` (a few steps) and `release()`. Each candidate built gets one uncounted
    call and a counted round at once; the rounds that follow take turns among those left
    (two or more: one alone has nothing to be compared with), while the budget lasts."""
    began, budget = clock(), Budget(plan, clock)
    trials, results, compiles, not_tried, shape, tokens_per_step = {}, {}, {}, {}, (), 0.0
    for candidate in plan.order:
        speeds = {c: r[0] for c, r in results.items() if not isinstance(r, str)}
        why = budget.verdict(candidate, speeds) if speeds else None
        if why:
            not_tried[candidate] = why
            progress(f"precision probe: {candidate.label()} {why}")
            continue
        try:
            trial = prepare(candidate)
        except Exception as error:  # a candidate that cannot run here is reported, not fatal
            results[candidate] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            progress(f"precision probe: {candidate.label()} failed ({results[candidate]})")
            continue
        trials[candidate], compiles[candidate] = trial, trial.compile_seconds
        shape, tokens_per_step = trial.batch_shape, trial.tokens_per_step
        budget.ready[candidate] = trial.ready_seconds
        trial.round()  # not counted: the first call after a warm-up ran at a third of the speed
        results[candidate] = [trial.round()]
        budget.round_seconds = max(budget.round_seconds, trial.round_seconds)
        if budget.started is None:
            budget.start(candidate, tokens_per_step, results[candidate][0])
        progress(f"precision probe: {candidate.label()} {results[candidate][0]:,.0f} tokens/s "
                 f"(compiled in {trial.compile_seconds:.1f} s)")  # fmt: skip
    _drop_slow(trials, results, compiles, plan, tokens_per_step, progress)
    for _ in range(ROUNDS - 1):
        if len(trials) < 2 or budget.spent() + len(trials) * budget.round_seconds > budget.seconds:
            break
        for candidate, trial in trials.items():
            results[candidate].append(trial.round())
    seconds = clock() - began
    measured = Measurement(results, compiles, seconds, shape, tokens_per_step, plan.shapes, not_tried, budget.seconds)
    return measured, trials


def _drop_slow(trials, results, compiles, plan, tokens_per_step, progress):
    """Releases the candidates that cannot win: the run estimated under one, even at twice
    its first round's speed, is longer than under the best so far by more than a tie (`TIE`:
    one within it may still be chosen, as the earlier candidate). The choice is by estimated
    run (`Measurement.run_seconds`), not by speed: on a short run a candidate at half the
    fastest's speed can still win on its cheaper compilation, and the run trains the winner's
    trial (were it kept by speed, a float32 at 32,529 tokens/s against float32+XLA's 77,410
    would be dropped, then chosen for a 6-step run, and the run would build it again)."""
    if not trials:
        return

    tokens = plan.planned_steps * tokens_per_step

    def run_seconds(candidate, tokens_per_second):
        return run_estimate(candidate, tokens_per_second, compiles[candidate], plan.shapes, tokens)

    best = min(run_seconds(c, results[c][0]) for c in trials)
    for candidate in [c for c in trials if run_seconds(c, 2 * results[c][0]) > best * (1 + TIE)]:
        progress(f"precision probe: {candidate.label()} cannot win even at twice its speed, not timed again")
        trials.pop(candidate).release()
