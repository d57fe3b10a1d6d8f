"""Choosing the precision policy, once, from the config and the hardware.

name, reason = select_policy("auto")
# ("float32", "CPU without AVX512_BF16 or AMX: bf16 and fp16 are emulated ...")
"""

import tensorflow as tf

# Compute dtype of each policy; variables are float32 under all of them.
COMPUTE_DTYPES = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


def select_policy(requested, devices=None, cpu_flags=None):
    """Returns (policy name, why). `auto` picks from the hardware:

    bf16 on GPUs of compute capability >= 8.0, TPUs and CPUs with AVX512_BF16 or AMX;
    fp16 on 7.x GPUs; float32 elsewhere. Never fp16 on a CPU: it is emulated there and
    ran several times slower than float32 on these machines.
    """
    if requested != "auto":
        return requested, "asked for in precision.policy"
    devices = describe_devices() if devices is None else devices
    tpus = [d for d in devices if d["type"] == "TPU"]
    gpus = [d for d in devices if d["type"] == "GPU"]
    if tpus:
        return "mixed_bfloat16", "TPU: bfloat16 is native"
    if gpus:
        capability = min(d.get("compute_capability") or (0, 0) for d in gpus)
        if capability >= (8, 0):
            return "mixed_bfloat16", f"GPU compute capability {capability[0]}.{capability[1]} >= 8.0: bf16 tensor cores"
        if capability >= (7, 0):
            return (
                "mixed_float16",
                f"GPU compute capability {capability[0]}.{capability[1]}: fp16 tensor cores, no bf16",
            )
        return "float32", f"GPU compute capability {capability[0]}.{capability[1]} < 7.0: no tensor cores"
    flags = cpu_flags_from_proc() if cpu_flags is None else cpu_flags
    if flags & {"avx512_bf16", "amx_bf16"}:
        return "mixed_bfloat16", "CPU with " + " and ".join(sorted(flags & {"avx512_bf16", "amx_bf16"}))
    return "float32", "CPU without AVX512_BF16 or AMX: half precision is emulated, not faster"


def describe_devices():
    devices = []
    for kind in ("GPU", "TPU"):
        for device in tf.config.list_physical_devices(kind):
            details = tf.config.experimental.get_device_details(device) if kind == "GPU" else {}
            devices.append(
                {
                    "type": kind,
                    "name": device.name,
                    "device_name": details.get("device_name"),  # e.g. "NVIDIA A100-SXM4-80GB"
                    "compute_capability": details.get("compute_capability"),
                }
            )
    return devices


def cpu_flags_from_proc(path="/proc/cpuinfo"):
    return set(_cpuinfo_field("flags", path).split())


def cpu_model_name(path="/proc/cpuinfo"):
    return _cpuinfo_field("model name", path)


def _cpuinfo_field(name, path):
    """The value of the first `name : value` line of /proc/cpuinfo ("" when unreadable)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def uses_loss_scaling(policy):
    """fp16's 5 exponent bits lose small gradients to underflow; bf16 has float32's range."""
    return policy == "mixed_float16"
