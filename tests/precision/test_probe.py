"""`auto` precision and XLA by measuring (`precision/probe.py`): every branch of the choice
with a fake measurement, the cache and the run-folder record; once for real on a tiny
model (`engine/probe_run.py`)."""

import json
import os

import pytest

from amptrain import config as config_lib
from amptrain.precision import probe
from amptrain.precision.probe import Candidate, Hardware

AMX = Hardware(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}), cpu_model="Xeon", cores=2)
AVX2 = Hardware(cpu_flags=frozenset({"avx2"}), cpu_model="EPYC", cores=2)
F32, F32X = Candidate("float32", False), Candidate("float32", True)
BF16, BF16X = Candidate("mixed_bfloat16", False), Candidate("mixed_bfloat16", True)
BF16F = Candidate("mixed_bfloat16", "fusible")


def gpu(major, minor):
    return {"type": "GPU", "name": "/physical_device:GPU:0", "compute_capability": (major, minor)}


SPAM_TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "data", "classify-spam", "train.csv")


def config(**keys):
    raw = {"task": "classification", "data": {"train": SPAM_TRAIN}, "precision": {}, "runtime": {}, "train": {}}
    for dotted, value in keys.items():
        section, name = dotted.split("__")
        raw.setdefault(section, {})[name] = value
    return config_lib.config_from_dict(raw)


def test_candidates_on_each_kind_of_machine():
    auto = config(runtime__jit_compile="auto")
    # On a CPU half precision is also tried with XLA around oneDNN's products ("fusible").
    excluded = {"fp16": probe.can_pay("mixed_float16", AMX)[1]}
    assert probe.candidates(auto, AMX) == ([F32, F32X, BF16, BF16X, BF16F], excluded)
    assert BF16F.label() == "bf16+fusible" and Candidate("float32", 1) == F32X
    found, excluded = probe.candidates(auto, AVX2)
    assert found == [F32, F32X]
    assert set(excluded) == {"bf16", "fp16"} and "emulated" in excluded["bf16"]
    a100 = Hardware(devices=({"type": "GPU", "name": "g", "compute_capability": (8, 0)},))
    assert [c.label() for c in probe.candidates(auto, a100)[0]] == [
        "float32", "float32+XLA", "bf16", "bf16+XLA", "fp16", "fp16+XLA",
    ]  # fmt: skip
    v100 = Hardware(devices=(gpu(7, 0),))
    assert [c.policy for c in probe.candidates(auto, v100)[0]][::2] == ["float32", "mixed_float16"]
    tpu = Hardware(devices=({"type": "TPU", "name": "t"},))
    assert {c.policy for c in probe.candidates(auto, tpu)[0]} == {"float32", "mixed_bfloat16"}


def test_named_keys_and_allow_narrow_the_candidates():
    assert probe.candidates(config(runtime__jit_compile=False), AMX)[0] == [F32, BF16]
    assert probe.candidates(config(precision__policy="mixed_bfloat16"), AMX)[0] == [BF16, BF16X, BF16F]
    assert probe.candidates(config(runtime__jit_compile="fusible"), AMX)[0] == [Candidate("float32", "fusible"), BF16F]
    only_f32 = config(precision__allow=["float32"])
    found, excluded = probe.candidates(only_f32, AMX)
    assert found == [F32, F32X] and excluded["bf16"] == "not in precision.allow"
    # check-numerics turns XLA off, so XLA is never tried
    assert probe.candidates(config(runtime__check_numerics=True), AMX)[0] == [F32, BF16]
    # allow naming only a policy that cannot pay here: it is tried all the same
    assert probe.candidates(config(precision__allow=["mixed_bfloat16"]), AVX2)[0] == [BF16, BF16X, BF16F]


def test_the_fastest_median_wins():
    chosen, why = probe.choose({F32: [100, 101, 99], F32X: [120, 300, 121], BF16: [150, 10, 149]})
    assert chosen == BF16  # medians 100, 121, 149: one fast or slow round does not decide
    assert why == "fastest measured: bf16 149 tokens/s; next float32+XLA 121 tokens/s"


def test_a_tie_goes_to_the_earlier_candidate():
    # 100 against 102: within 3%, so float32 (numerically simpler, nothing to compile) wins
    chosen, why = probe.choose({F32: [100], BF16X: [102]}, order=[F32, BF16X])
    assert chosen == F32 and "within 3% of the best (bf16+XLA 102 tokens/s)" in why
    assert probe.choose({F32: [100], BF16X: [104]}, order=[F32, BF16X])[0] == BF16X
    assert probe.choose({F32: [100], BF16: [100]}, order=[BF16, F32])[0] == BF16  # exact tie: the order


def test_a_failing_candidate_is_reported_not_chosen():
    chosen, _ = probe.choose({F32: [100], BF16: "ResourceExhaustedError: out of memory"})
    assert chosen == F32
    assert probe.choose({F32: "boom", BF16: []}) == (None, "every candidate failed")


class FakeMeasure:
    def __init__(self, speeds, compile_seconds=None, shapes=6):
        self.speeds, self.compiles, self.shapes, self.calls = speeds, compile_seconds or {}, shapes, 0

    def __call__(self, found):
        self.calls += 1
        results = {c: self.speeds[c] for c in found}
        return probe.Measurement(results, dict(self.compiles), 12.5, (32, 128), 1000.0, self.shapes)


def test_xla_must_pay_for_its_compilations_within_the_run():
    """XLA compiles once a batch shape: 6 buckets x 20 s against one 5 s trace. At 1,000
    real tokens a step, 110 against 100 tokens/s saves 0.91 s a step: 105 s of extra
    compilation pays after 116 steps, and by more than a tie's 3% after about 190."""
    measured = FakeMeasure({F32: [100.0], F32X: [110.0]}, {F32: 5.0, F32X: 20.0})([F32, F32X])
    for steps, expected in ((100, F32), (130, F32), (200, F32X), (10_000, F32X)):
        chosen, why = probe.choose(measured.results, [F32, F32X], lambda c, m, n=steps: measured.run_seconds(c, m, n))
        assert chosen == expected, steps
    assert measured.run_seconds(F32X, 110.0, 100) == pytest.approx(6 * 20 + 100 * 1000 / 110)
    assert why.startswith("shortest estimated run: float32+XLA 110 tokens/s, run ~91,029 s; next float32")
    # a cached measurement reads back as it was written
    assert probe.Measurement.from_json(json.loads(json.dumps(measured.to_json()))) == measured


def decide(cfg, measure, steps=1000, hardware=AMX, recorded=None):
    return probe.decide(cfg, hardware, steps, lambda found: probe.cache_key(hardware, cfg, (32, 128), found),
                        measure, recorded)  # fmt: skip


def test_measured_once_then_cached_then_reused_from_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    cfg = config(runtime__jit_compile="auto")
    measure = FakeMeasure(
        {F32: [100, 100, 100], F32X: [110] * 3, BF16: [200, 190, 210], BF16X: "XlaError: no", BF16F: [180] * 3}
    )
    first = decide(cfg, measure)
    assert (first["policy"], first["jit_compile"], first["source"]) == ("mixed_bfloat16", False, "measured")
    assert [c["tokens_per_second"] for c in first["candidates"]] == [100, 110, 200, None, 180]
    assert first["planned_steps"] == 1000 and first["tokens_per_step"] == 1000.0
    assert first["candidates"][3]["error"] == "XlaError: no"
    assert probe.summary(first).startswith(
        "precision probe (measured in 12.5 s), tokens/s: "
        "float32 100, float32+XLA 110, bf16 200, bf16+XLA failed, bf16+fusible 180 -> bf16"
    )
    second = decide(cfg, measure)  # the same config on the same machine: the cache, no measurement
    assert measure.calls == 1 and second["source"] == "cache"
    assert (second["policy"], second["jit_compile"]) == (first["policy"], first["jit_compile"])
    # another model is another key
    decide(config(runtime__jit_compile="auto", model__hidden_dim=128), measure)
    assert measure.calls == 2
    # a resume takes the run folder's decision, whatever the cache says now
    (tmp_path / "cache").rename(tmp_path / "gone")
    resumed = decide(cfg, measure, recorded={**first, "source": "measured"})
    assert measure.calls == 2 and resumed["source"] == "run folder" and resumed["policy"] == "mixed_bfloat16"
    # a short run measures nothing, but a cached measurement of its model decides it
    (tmp_path / "gone").rename(tmp_path / "cache")
    short = decide(config(runtime__jit_compile="auto", model__hidden_dim=128), measure, steps=10)
    assert (short["source"], short["policy"], short["jit_compile"]) == ("cache", "mixed_bfloat16", False)
    assert measure.calls == 2 and short["reason"].startswith("shortest estimated run: bf16 200 tokens/s")


def test_a_fusible_choice_is_recorded_and_applied_as_the_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    cfg = config(runtime__jit_compile="auto")
    speeds = {F32: [100], F32X: [110], BF16: [200], BF16X: [90], BF16F: [240]}
    record = json.loads(json.dumps(decide(cfg, FakeMeasure(speeds))))  # as precision.json holds it
    assert (record["policy"], record["jit_compile"]) == ("mixed_bfloat16", "fusible")
    assert "-> bf16+fusible: shortest estimated run" in probe.summary(record)
    applied = probe.apply(cfg, record)
    assert (applied.precision.policy, applied.runtime.jit_compile) == ("mixed_bfloat16", "fusible")
    assert probe.apply(cfg, {"policy": "float32", "jit_compile": True}).runtime.jit_compile is True
    cached = decide(cfg, FakeMeasure({}))  # read back from the cache: the mode, not a bool
    assert (cached["source"], cached["jit_compile"]) == ("cache", "fusible")


def test_no_measurement_when_named_alone_or_short(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path))
    measure = FakeMeasure({})
    named = decide(config(precision__policy="mixed_bfloat16", runtime__jit_compile=False), measure)
    assert (named["policy"], named["jit_compile"], named["source"]) == ("mixed_bfloat16", False, "named")
    alone = decide(config(runtime__jit_compile=True), measure, hardware=AVX2, steps=10)  # float32 is all there is
    assert (alone["policy"], alone["jit_compile"], alone["source"]) == ("float32", True, "named")
    short = decide(config(runtime__jit_compile="auto"), measure, steps=probe.MIN_STEPS - 1)
    assert (short["policy"], short["jit_compile"], short["source"]) == ("mixed_bfloat16", False, "rule")
    assert "too short to pay for a probe" in short["reason"]
    assert measure.calls == 0 and not os.listdir(tmp_path)


def test_every_candidate_failing_falls_back_to_the_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path))
    record = decide(config(runtime__jit_compile=False), FakeMeasure({F32: "a", BF16: "b"}), hardware=AMX)
    assert (record["policy"], record["source"]) == ("mixed_bfloat16", "measured")
    assert record["reason"].startswith("every candidate failed; CPU with amx_bf16 and avx512_bf16")


def test_the_rule_keeps_xla_off_on_a_cpu_and_within_allow():
    assert probe.rule(config(runtime__jit_compile="auto"), AMX)[0] == BF16
    assert probe.rule(config(runtime__jit_compile="auto"), Hardware(devices=(gpu(8, 0),)))[0] == BF16X
    chosen, why = probe.rule(config(precision__allow=["float32"]), AMX)
    assert chosen.policy == "float32" and "not in precision.allow" in why


def test_config_keys_are_checked():
    expected = r"runtime.jit_compile: expected true, false, \"fusible\" or \"auto\""
    with pytest.raises(config_lib.ConfigError, match=expected):
        config(runtime__jit_compile="sometimes")
    with pytest.raises(config_lib.ConfigError, match="precision.allow: expected a list of distinct policies"):
        config(precision__allow=["float32", "float64"])
    with pytest.raises(config_lib.ConfigError, match="precision.policy: expected a policy that precision.allow lists"):
        config(precision__policy="mixed_float16", precision__allow=["float32"])


@pytest.mark.slow  # four candidates compiled and timed: about a minute
def test_a_real_probe_on_a_tiny_model(tiny, tmp_path, monkeypatch):
    """The real measurement: both precisions and XLA on and off, timed, and the fit that
    follows trains with the choice, recorded in the run folder and the run record."""
    import amptrain

    monkeypatch.setattr(probe, "MIN_STEPS", 1)
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    amptrain.fit(
        str(tiny / "tiny.toml"), {"runtime.jit_compile": "auto", "precision.allow": ["float32", "mixed_bfloat16"],
                      "train.steps": 4}, run_dir=str(run))  # fmt: skip
    record = json.loads((run / "precision.json").read_text())
    found = {c["label"]: c["tokens_per_second"] for c in record["candidates"]}
    half = {"bf16", "bf16+XLA", "bf16+fusible"}
    assert set(found) == {"float32", "float32+XLA", *half} or set(found) == {"float32", "float32+XLA"}
    assert all(v > 0 for v in found.values())
    # The shortest estimated run of what was measured (for 4 steps, mostly the compile
    # times): not necessarily the fastest step, and which one depends on the machine's load.
    measured = probe.Measurement.from_json(record)
    expected, _ = probe.choose(
        measured.results, estimate=lambda c, median: measured.run_seconds(c, median, record["planned_steps"])
    )
    assert Candidate(record["policy"], record["jit_compile"]) == expected
    with open(run / "metrics.jsonl") as f:
        run_record = next(r for r in map(json.loads, f) if r["kind"] == "run")
    assert (run_record["policy"], run_record["jit_compile"]) == (record["policy"], record["jit_compile"])
    assert run_record["precision_choice"]["candidates"] == record["candidates"]
    assert os.listdir(tmp_path / "cache" / "probe") == [record["key"] + ".json"]
