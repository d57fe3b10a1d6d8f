"""`amptrain doctor`: what this machine offers mixed precision, before a run.

    report = diagnose()            # versions, devices, XLA, TF32, the `auto` policy, warnings, peaks
    print(format_report(report))   # or json.dumps(report)

The policy is the hardware rule (`autoprecision.probe.rule`, the one a run too short to repay
a probe keeps); a longer run with `precision.policy = "auto"` measures its candidates at its
start, within a budget, instead (`autoprecision/probe.py`). The matrix-product peaks are
measured once a machine and cached (`hardware/peaks.py`), for the bench and the MFU figures.
"""

import importlib.metadata
import os

# The CPU flags that decide what half precision costs on a CPU.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def diagnose(measure_peaks=True, measure=None, refresh=False):
    """The report as a JSON-ready dict. `measure`: the peak measurement (`hardware.peaks`'s
    by default; tests pass a quick one); `refresh` measures again instead of the cache."""
    import tensorflow as tf

    from amptrain.autoprecision import probe
    from amptrain.autoprecision.measurement import SHARE
    from amptrain.config import Config

    hardware = probe.Hardware.detect()
    config = Config()  # the defaults: policy and jit_compile "auto", every policy allowed
    chosen, why = probe.rule(config.precision, config.runtime, hardware)
    found, excluded = probe.candidates(config.precision, config.runtime, hardware)
    report = {
        "versions": versions(),
        "gpus": [_gpu(d) for d in hardware.devices if d["type"] == "GPU"],
        "tpus": [d["name"] for d in hardware.devices if d["type"] == "TPU"],
        "cpu": {"model": hardware.cpu_model, "cores": hardware.cores},
        "cpu_flags": [flag for flag in CPU_FLAGS if flag in hardware.cpu_flags],
        "xla": xla_state(),
        "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
        "policy": chosen.policy,
        "jit_compile": chosen.jit_compile,
        "policy_reason": why,
        "auto_measures": {
            "budget_share": SHARE,
            "candidates": [c.label() for c in found],
            "excluded": excluded,
        },
        "warnings": warnings(hardware),
        "peaks": {},
    }
    if measure_peaks:
        from amptrain.hardware import peaks

        measured = peaks.measured_peaks(peaks.DTYPES, measure or peaks.timed_matmul_peak, refresh=refresh)
        report["peaks"] = {dtype: dict(value) for dtype, value in measured.items()}
    return report


ONLY_ONE = "the only candidate: a run measures nothing, it has nothing to compare"


def probe_config(path, overrides=()):
    """What `precision.policy = "auto"` measures for the run the config at `path` plans
    (`autoprecision/trials.py`, within the same budget, without the cache): each candidate's
    tokens/s (or why it was not built), the choice, what the probe cost and what it
    expects to save against the hardware rule."""
    from amptrain import config as config_lib
    from amptrain import distribute
    from amptrain.autoprecision import probe
    from amptrain.autoprecision.trials import measure_candidates, release
    from amptrain.tasks import prepared_in_scratch

    config = config_lib.load_config(path, overrides)
    distribute.configure_devices(config.runtime)  # runtime.cpu_replicas, before TensorFlow starts
    strategy = distribute.select_strategy(config.runtime).strategy
    task = prepared_in_scratch(config)
    planned = config.train.total_steps(max(1, task.steps_per_epoch // config.train.accumulation_steps))
    plan, base = probe.plan_for(config.precision, config.runtime, probe.Hardware.detect(), planned)
    if isinstance(plan, probe.Decision):  # one candidate (an AVX2 CPU, or the keys named): nothing to compare
        decision = plan
        only = {"label": decision.candidate.label(), "tokens_per_second": None, "not_tried": ONLY_ONE}
        report = {"candidates": [only], "probe_seconds": 0.0, "batch_shape": list(task.probe_batches()[1])}
    else:
        measured, trials = measure_candidates(task, config, strategy, plan, progress=lambda line: None)
        release(trials.values(), fresh_names=True)
        decision = probe.conclude(plan, measured, "measured", base, None, None)
        report = {}
    report = {**decision.to_json(), **report}
    return {
        "config": str(path),
        "choice": decision.candidate.label(),
        "why": decision.reason,
        **{k: report.get(k) for k in ("candidates", "probe_seconds", "expected_saving_seconds", "budget_seconds")},
        **{k: report.get(k) for k in ("batch_shape", "planned_steps", "excluded")},
    }


def versions():
    import keras
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    try:
        keras_hub = importlib.metadata.version("keras-hub")
    except importlib.metadata.PackageNotFoundError:
        keras_hub = None
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_hub": keras_hub,
        "cuda": build.get("cuda_version"),  # None: a CPU-only build
        "cudnn": build.get("cudnn_version"),
    }


def _gpu(device):
    import tensorflow as tf

    capability = device.get("compute_capability")
    try:  # only a GPU TensorFlow has initialised answers
        memory = tf.config.experimental.get_memory_info(device["name"].replace("/physical_device:", ""))
    except (ValueError, RuntimeError):
        memory = None
    return {
        "name": device["name"],
        "device_name": device.get("device_name"),
        "compute_capability": list(capability) if capability else None,
        # fp16 tensor cores since Volta (7.0), bf16 ones since Ampere (8.0)
        "tensor_cores": bool(capability) and tuple(capability) >= (7, 0),
        "memory_bytes": memory["current"] if memory else None,
        "peak_memory_bytes": memory["peak"] if memory else None,
    }


def xla_state():
    """Whether TensorFlow has XLA and compiles a product with it here."""
    import tensorflow as tf

    try:
        tf.function(lambda x: tf.linalg.matmul(x, x), jit_compile=True)(tf.ones((2, 2))).numpy()
        compiles, error = True, None
    except Exception as failure:  # noqa: BLE001 - any failure means XLA is not usable; say which
        compiles, error = False, f"{type(failure).__name__}: {str(failure).splitlines()[0][:200]}"
    return {"built_with_xla": bool(tf.test.is_built_with_xla()), "compiles": compiles, "error": error}


def warnings(hardware):
    """The cases the mixed-precision guide names: float16 where there are no fp16 tensor
    cores (a GPU before Volta, a CPU), bfloat16 on a CPU without bf16 units."""
    found = []
    gpus = [d for d in hardware.devices if d["type"] == "GPU"]
    for gpu in gpus:
        capability = tuple(gpu.get("compute_capability") or (0, 0))
        if capability < (7, 0):
            found.append(
                f"{gpu.get('device_name') or gpu['name']} (compute capability {capability[0]}.{capability[1]}) has "
                "no tensor cores: mixed_float16 would run slower than float32 there"
            )
    if not hardware.accelerators():
        found.append("no GPU: a CPU has no float16 matrix units, mixed_float16 is not faster than float32 there")
        if not hardware.cpu_flags & {"avx512_bf16", "amx_bf16"}:
            found.append("CPU without AVX512_BF16 or AMX: mixed_bfloat16 is emulated, not faster than float32")
    return found


def format_report(report):
    v = report["versions"]
    lines = [
        f"TensorFlow {v['tensorflow']}, Keras {v['keras']}, keras-hub {v['keras_hub'] or 'not installed'}, "
        + (f"built for CUDA {v['cuda']}, cuDNN {v['cudnn']}" if v["cuda"] else "no CUDA (a CPU build)"),
        f"CPU: {report['cpu']['model'] or 'unknown'}, {report['cpu']['cores']} cores, "
        f"flags {' '.join(report['cpu_flags']) or 'none of ' + ' '.join(CPU_FLAGS)}",
    ]
    for gpu in report["gpus"]:
        capability = ".".join(map(str, gpu["compute_capability"] or ["?"]))
        memory = f", {gpu['memory_bytes'] / 2**20:,.0f} MiB in use" if gpu["memory_bytes"] is not None else ""
        lines.append(
            f"GPU {gpu['name']}: {gpu['device_name'] or 'unnamed'}, compute capability {capability}, "
            f"tensor cores {'yes' if gpu['tensor_cores'] else 'no'}{memory}"
        )
    lines.append("no GPU" if not report["gpus"] else f"{len(report['gpus'])} GPU(s)")
    lines += [f"TPU {name}" for name in report["tpus"]]
    xla = report["xla"]
    lines.append(
        f"XLA: {'compiles' if xla['compiles'] else 'does not compile (' + str(xla['error']) + ')'}; "
        f"TF32 {'on' if report['tf32'] else 'off'} (float32 products on GPUs of compute capability 8.0 or more)"
    )
    auto = report["auto_measures"]
    jit = "on" if report["jit_compile"] else "off"
    lines.append(f"policy auto -> {report['policy']}, XLA {jit} ({report['policy_reason']})")
    lines.append(
        f"  a run that can repay it measures at its start, within {auto['budget_share']:.0%} of its time: "
        f"{', '.join(auto['candidates'])}" + "".join(f"; not {label}: {why}" for label, why in auto["excluded"].items())
    )
    for dtype, peak in report["peaks"].items():
        count = peak.get("measurements", 1)
        best = f"; the best of {count} measurements, the last {peak['last_flops'] / 1e9:,.1f}" if count > 1 else ""
        lines.append(
            f"peak {dtype:<8} {peak['flops'] / 1e9:8,.1f} GFLOP/s  ({peak['size']}x{peak['size']} matrix product{best})"
        )
    lines += [f"warning: {text}" for text in report["warnings"]]
    if report.get("probe"):
        measured = report["probe"]
        lines.append(
            f"probe of {measured['config']} (batches of {' x '.join(map(str, measured['batch_shape'] or ()))}, "
            f"{measured['probe_seconds']} s, expected saving {measured['expected_saving_seconds']} s): "
            f"{measured['choice']}, {measured['why']}"
        )
        for row in measured["candidates"] or ():
            shown = row.get("not_tried") or row.get("error") or ", ".join(f"{v:,.0f}" for v in row["rounds"])
            lines.append(f"  {row['label']:<12} {shown}" + (" tokens/s" if row.get("rounds") else ""))
    return "\n".join(lines)


def cache_note():
    from amptrain.files import cache_dir
    from amptrain.hardware.peaks import PEAKS_FILE

    where = os.path.join(cache_dir(), PEAKS_FILE)
    return f"peaks cached in {where} (the best of every measurement; --remeasure to measure again)"
