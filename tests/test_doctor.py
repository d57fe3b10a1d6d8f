"""`amptrain doctor`: the CPU branch for real (in-process, a short peak measurement), the
GPU and TPU branches with fakes of TensorFlow's device calls (there is no GPU here)."""

import functools
import json

import pytest
import tensorflow as tf

from amptrain import cli, doctor
from amptrain.hardware import peaks


@pytest.fixture
def quick_peaks(monkeypatch):
    """The real measurement, a few hundredths of a second a dtype; counts its calls."""
    calls = []
    real = peaks.timed_matmul_peak

    def measure(dtype):
        calls.append(dtype)
        return real(dtype, seconds=0.02, max_size=256)

    monkeypatch.setattr(peaks, "timed_matmul_peak", measure)
    return calls


def test_doctor_on_this_cpu(capsys, quick_peaks, monkeypatch, tmp_path):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path))
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert isinstance(report["cpu_flags"], list) and report["gpus"] == [] and report["tpus"] == []
    assert report["cpu"]["cores"] >= 1 and report["versions"]["tensorflow"] == tf.__version__
    bf16_units = {"avx512_bf16", "amx_bf16"} & set(report["cpu_flags"])
    assert report["policy"] == ("mixed_bfloat16" if bf16_units else "float32")
    assert report["jit_compile"] is False and "XLA off on a CPU" in report["policy_reason"]
    assert any("no float16 matrix units" in w for w in report["warnings"])
    assert set(report["peaks"]) == {"float32", "bfloat16", "float16"}
    assert all(p["flops"] > 0 for p in report["peaks"].values())
    assert quick_peaks == ["float32", "bfloat16", "float16"]
    # measured once: the second doctor (and MFU, bench) reads the cache
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert quick_peaks == ["float32", "bfloat16", "float16"]
    assert "no GPU" in text and "policy auto -> " in text and "peak bfloat16" in text
    assert (tmp_path / "peaks.json").exists()


def fake_devices(monkeypatch, gpus=(), tpus=0):
    """TensorFlow's device list and details faked: `gpus` are (device name, capability)."""
    devices = {
        "GPU": [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(len(gpus))],
        "TPU": [tf.config.PhysicalDevice(f"/physical_device:TPU:{i}", "TPU") for i in range(tpus)],
    }
    details = {d.name: {"device_name": n, "compute_capability": c} for d, (n, c) in zip(devices["GPU"], gpus)}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: devices.get(kind, []))
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: details[device.name])
    memory = {"current": 3 * 2**20, "peak": 5 * 2**20}
    monkeypatch.setattr(tf.config.experimental, "get_memory_info", lambda name: memory)


@pytest.mark.parametrize(
    "name, capability, policy, tensor_cores",
    [
        ("NVIDIA A100-SXM4-80GB", (8, 0), "mixed_bfloat16", True),
        ("Tesla V100-SXM2-16GB", (7, 0), "mixed_float16", True),
        ("Tesla T4", (7, 5), "mixed_float16", True),
        ("NVIDIA GeForce GTX 1080", (6, 1), "float32", False),
    ],
)
def test_doctor_on_faked_gpus(monkeypatch, name, capability, policy, tensor_cores):
    fake_devices(monkeypatch, gpus=[(name, capability)])
    report = doctor.diagnose(measure_peaks=False)
    assert report["policy"] == policy and report["jit_compile"] is True  # XLA on an accelerator
    gpu = report["gpus"][0]
    assert gpu["device_name"] == name and gpu["compute_capability"] == list(capability)
    assert gpu["tensor_cores"] is tensor_cores and gpu["memory_bytes"] == 3 * 2**20
    fp16_warnings = [w for w in report["warnings"] if "mixed_float16 would run slower" in w]
    assert len(fp16_warnings) == (0 if tensor_cores else 1)
    assert not any("on a CPU" in w for w in report["warnings"])
    text = doctor.format_report(report)
    assert f"tensor cores {'yes' if tensor_cores else 'no'}" in text and f"policy auto -> {policy}" in text
    json.dumps(report)  # --json


def test_doctor_on_a_faked_tpu(monkeypatch):
    fake_devices(monkeypatch, tpus=1)
    report = doctor.diagnose(measure_peaks=False)
    assert report["policy"] == "mixed_bfloat16" and report["policy_reason"].startswith("TPU")
    assert report["tpus"] == ["/physical_device:TPU:0"] and report["warnings"] == []
    assert [c for c in report["auto_measures"]["candidates"] if "fp16" in c] == []


def test_a_cpu_without_bf16_units_is_warned_about(monkeypatch):
    from amptrain.autoprecision import probe

    avx2 = probe.Hardware(cpu_flags=frozenset({"avx2"}), cpu_model="EPYC", cores=2)
    warned = doctor.warnings(avx2)
    assert any("mixed_bfloat16 is emulated" in w for w in warned) and len(warned) == 2


def test_peaks_are_measured_once_and_keyed_by_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path))
    calls = []

    def measure(dtype):
        calls.append(dtype)
        return 1e9, 64

    assert peaks.measured_peaks(["float32"], measure)["float32"]["flops"] == 1e9
    assert peaks.measured_peaks(["float32", "bfloat16"], measure)["bfloat16"]["size"] == 64
    assert calls == ["float32", "bfloat16"]
    peak, source = peaks.run_peak("mixed_bfloat16", devices=[], measure=measure)
    assert peak == 1e9 and "cached" in source and calls == ["float32", "bfloat16"]
    peaks.measured_peaks(["float32"], measure, refresh=True)
    assert calls == ["float32", "bfloat16", "float32"]
    # measured again under load (half the figure), then quietly: the best is kept
    halved = peaks.measured_peaks(["float32"], lambda dtype: (5e8, 64), refresh=True)["float32"]
    assert halved["flops"] == 1e9 and halved["last_flops"] == 5e8 and halved["measurements"] == 3
    assert peaks.measured_peaks(["float32"], lambda dtype: (2e9, 128), refresh=True)["float32"]["flops"] == 2e9
    assert peaks.cached_peaks()["float32"] == {"flops": 2e9, "size": 128, "seconds": 0.0, "last_flops": 2e9,
                                               "measurements": 4}  # fmt: skip
    # a known accelerator has its data-sheet peak; an unknown one none
    assert peaks.run_peak("mixed_bfloat16", devices=[{"type": "GPU", "device_name": "NVIDIA A100"}])[0] == 312e12
    assert peaks.run_peak("float32", devices=[{"type": "GPU", "device_name": "Mystery"}]) is None


def test_the_quick_measurement_is_a_real_product():
    flops, size = functools.partial(peaks.timed_matmul_peak, seconds=0.01, max_size=128)("float32")
    assert size == 128 and flops > 0


@pytest.mark.slow  # compiles and times the candidates: about 15 s
def test_doctor_probe_measures_the_auto_candidates_on_a_config(tiny, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path))
    argv = ["doctor", "--json", "--no-peaks", "--probe", str(tiny / "tiny.toml"), "--set", "runtime.jit_compile=false"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    measured = report["probe"]
    rows = {row["label"]: row for row in measured["candidates"]}
    assert measured["batch_shape"][0] == 8 and report["peaks"] == {}
    if report["policy"] != "mixed_bfloat16":  # an AVX2 CPU: float32 alone is left, and nothing is measured
        assert rows == {"float32": {"label": "float32", "tokens_per_second": None, "not_tried": doctor.ONLY_ONE}}
        assert measured["choice"] == "float32" and measured["probe_seconds"] == 0
        assert measured["expected_saving_seconds"] is None
        return
    labels = {"float32", "bf16"}
    assert set(rows) == labels and measured["choice"] in labels
    # the tiny config's 12 steps cannot repay a second candidate: the rule's alone is timed
    assert [label for label, row in rows.items() if row["tokens_per_second"]] == [measured["choice"]]
    assert all((row["tokens_per_second"] or 0) > 0 or "cannot repay" in row["not_tried"] for row in rows.values())
    assert measured["probe_seconds"] > 0 and measured["expected_saving_seconds"] == 0
