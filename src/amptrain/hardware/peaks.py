"""The CPU's matrix-product peak per dtype: measured once (about two seconds a dtype),
cached per machine and TensorFlow version, reused by `amptrain doctor`, the bench and the
MFU of `train` records.

    peaks = measured_peaks(["float32", "bfloat16"])   # {dtype: {"flops", "size", "seconds", ...}}
    measured_peaks(["bfloat16"], refresh=True)        # measured again; the best is kept
    peak, source = run_peak("mixed_bfloat16")         # data sheet on a known GPU/TPU, else measured

A measurement on a busy machine reads low (another process had half the cores), and an MFU
against it reads high. So the cache keeps the best of every measurement of this machine
(`flops`; `last_flops` is the newest, `measurements` how many), and a measurement again
(`doctor --remeasure`, or a run whose MFU would pass 100%: `engine/utilisation.py`) can
only raise it.

A data-sheet peak needs the accelerator's name (`flops.PEAKS`); a CPU has no such table,
so its peak is what a square product of the largest size that fits the time budget
reaches (the best of the timed runs).
"""

import hashlib
import json
import os
import time

PEAKS_FILE = "peaks.json"
DTYPES = ("float32", "bfloat16", "float16")


def timed_matmul_peak(dtype="float32", seconds=2.0, max_size=2048):
    """(FLOP/s, size): a square product in `dtype`, grown from 256 until one call takes
    about an eighth of `seconds` (or `max_size`), then timed repeatedly for `seconds`; the
    best run counts. Emulated dtypes (float16 on a CPU) stay small and still finish."""
    import tensorflow as tf

    # One trace for every size (a square of any side): a trace a size would set off
    # TensorFlow's "triggered tf.function retracing" warning by the third dtype.
    product = tf.function(
        lambda x: tf.reduce_sum(tf.cast(tf.linalg.matmul(x, x), tf.float32)),
        input_signature=[tf.TensorSpec((None, None), dtype)],
    )

    def matrix(size):
        matrix = tf.cast(tf.random.normal((size, size)), dtype)
        product(matrix).numpy()  # trace and warm up at this shape
        return matrix

    def timed(matrix):
        started = time.perf_counter()
        product(matrix).numpy()
        return time.perf_counter() - started

    size = min(256, max_size)
    a = matrix(size)
    took = timed(a)
    while size < max_size and took * 8 < seconds / 4:  # the next size costs 8 times as much
        size *= 2
        a = matrix(size)
        took = timed(a)
    best, runs, deadline = took, 1, time.perf_counter() + seconds
    while time.perf_counter() < deadline or runs < 3:
        best = min(best, timed(a))
        runs += 1
    return 2 * size**3 / best, size


def machine_key():
    """The cache key: the machine (`hardware.machine.Hardware.describe`) and TensorFlow's version."""
    import tensorflow as tf

    from amptrain.hardware.machine import Hardware

    what = {"machine": Hardware.detect().describe(), "tensorflow": tf.__version__}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16], what


def _path():
    from amptrain.files import cache_dir

    return os.path.join(cache_dir(), PEAKS_FILE)


def _read():
    try:
        with open(_path(), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # no cache yet, or a damaged one: measured again


def cached_peaks():
    """{dtype: {"flops", "size", "seconds"}} measured on this machine before, else {}."""
    key, _ = machine_key()
    return _read().get(key, {}).get("peaks", {})


def measured_peaks(dtypes=DTYPES, measure=timed_matmul_peak, refresh=False):
    """The cached peak of each dtype; the missing ones (all with `refresh`) measured and
    cached. A dtype measured before keeps the best of its measurements."""
    key, what = machine_key()
    everything = _read()
    entry = everything.setdefault(key, {**what, "peaks": {}})
    for dtype in dtypes:
        if dtype in entry["peaks"] and not refresh:
            continue
        started = time.perf_counter()
        flops, size = measure(dtype)
        now = {"flops": flops, "size": size, "seconds": round(time.perf_counter() - started, 2)}
        entry["peaks"][dtype] = _best(entry["peaks"].get(dtype), now)
    os.makedirs(os.path.dirname(_path()), exist_ok=True)
    temporary = _path() + f".{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(everything, f, indent=1)
    os.replace(temporary, _path())  # several processes may measure at once: whole files only
    return {dtype: entry["peaks"][dtype] for dtype in dtypes}


def _best(before, now):
    """The cache entry of a dtype after a measurement `now`: the best of every one so far."""
    count = (before or {}).get("measurements", 1 if before else 0) + 1
    best = before if before and before["flops"] >= now["flops"] else now
    return {**best, "last_flops": now["flops"], "measurements": count}


def run_peak(policy, devices=None, measure=timed_matmul_peak, refresh=False):
    """(peak FLOP/s, source) for training under `policy`: the first accelerator's data
    sheet, else the CPU's measured (cached; with `refresh` measured again, the best kept)
    peak in the policy's compute dtype; None when an accelerator is not in the table."""
    from amptrain.hardware.flops import peak_flops
    from amptrain.precision.policy import COMPUTE_DTYPES, describe_devices

    devices = describe_devices() if devices is None else devices
    if devices:
        return peak_flops(policy, devices[0].get("device_name") or devices[0]["type"])
    dtype = COMPUTE_DTYPES[policy]
    was_cached = dtype in cached_peaks() and not refresh
    peak = measured_peaks([dtype], measure, refresh=refresh)[dtype]
    how = "cached" if was_cached else f"measured now in {peak['seconds']:.1f} s"
    if peak.get("measurements", 1) > 1:
        how += f", the best of {peak['measurements']} measurements"
    return peak["flops"], f"CPU: a {peak['size']}x{peak['size']} {dtype} matrix product ({how})"
