"""Memory and model FLOPs utilisation (MFU) for each `train` record.

    utilisation = Utilisation.for_run(model, policy, strategy)   # the peak: data sheet or measured
    utilisation.figures(window)  # {"memory_bytes", "peak_memory_bytes", "mfu"}

MFU is the bench's (`hardware/flops.py`): training FLOPs per real token, at the window's mean
padded length, times real tokens/s, over the peak of the run's precision: the data sheet's
for a known GPU or TPU (times the replicas), else this CPU's measured matrix-product peak
in the compute dtype (`hardware/peaks.py`: cached per machine, measured at the run's start
when missing, about two seconds). None (`mfu: null`, no TensorBoard scalar, no MFU on the
progress line) when the peak is unknown (an accelerator not in the table) or when the
model's FLOPs cannot be counted (a layer `hardware/flops.py` does not know, named in the
log; no peak is measured then). Logical CPU replicas share one CPU, so the CPU peak is not
multiplied; workers on several machines would each have their own, so there the figure is
understated.

An MFU above 100% is never reported: it means the peak was measured low (on a busy machine,
say). The window's figure is then 100%, and before the next window starts (never beside a
timed step) the CPU's peak is measured again, once a run; the cache keeps the best of every
measurement (`hardware/peaks.py`), so later windows and later runs divide by it.
"""

import functools
import logging

from amptrain.engine.run_log import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


def memory_in_use():
    """(bytes in use, peak bytes): the first GPU's allocator (`get_memory_info`), else the
    process's resident memory and its high-water mark (/proc/self/status VmRSS, VmHWM);
    (None, None) where neither can be read."""
    import tensorflow as tf

    if _has_gpu():
        info = tf.config.experimental.get_memory_info("GPU:0")
        return int(info["current"]), int(info["peak"])
    return resident_memory()


@functools.cache
def _has_gpu():
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))  # 0.1 ms a call: asked once


def resident_memory(path="/proc/self/status"):
    found = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name, value = line.split(":", 1)
                    found[name] = int(value.split()[0]) * 1024  # the file says kB
    except (OSError, ValueError):
        pass
    return found.get("VmRSS"), found.get("VmHWM")


class Utilisation:
    def __init__(self, flops_at, peak=None, remeasure=None):
        # flops_at(length): training FLOPs per token at a padded length (linear in it);
        # None when the model's FLOPs cannot be counted
        self.flops_at = flops_at
        self.peak = peak  # (FLOP/s, where it comes from) or None
        # remeasure(): the peak measured again, as `peak`; None where there is nothing to
        # measure (a data sheet's peak); once used, None
        self._remeasure = remeasure
        self.remeasure_due = False

    @classmethod
    def for_run(cls, model, policy, strategy, measure=None):
        from amptrain.hardware.flops import count_flops
        from amptrain.hardware.peaks import run_peak, timed_matmul_peak
        from amptrain.precision.policy import describe_devices

        count = count_flops(model)
        if count.uncounted:  # unknown rather than a wrong figure; no peak to measure for it
            more = f" and {len(count.uncounted) - 1} more" if len(count.uncounted) > 1 else ""
            logger.info(f"MFU: the model's FLOPs cannot be counted ({count.uncounted[0]}{more}); mfu is null")
            return cls(None, None)
        devices = describe_devices()
        try:
            peak = run_peak(policy, devices, measure or timed_matmul_peak)
        except Exception as error:  # noqa: BLE001 - a figure, never a reason to stop a run
            logger.warning(f"MFU: no peak ({type(error).__name__}: {error}); mfu is null")
            peak = None
        if peak is not None and devices:
            replicas = strategy.num_replicas_in_sync
            peak = (peak[0] * replicas, f"{replicas} x {peak[1]}" if replicas > 1 else peak[1])
        if peak is None:
            logger.info("MFU: the peak of this device is not known; mfu is null")
        else:
            logger.info(f"MFU against {peak[0] / 1e9:,.1f} GFLOP/s: {peak[1]}")
        again = None
        if peak is not None and not devices:
            again = functools.partial(run_peak, policy, devices, measure or timed_matmul_peak, refresh=True)
        return cls(count.per_token, peak, again)

    def mfu(self, window):
        """The window's MFU, at most 1 (a figure above marks the peak for measuring again)."""
        if self.flops_at is None or self.peak is None or not window.examples:
            return None
        length = window.tokens[1] / window.examples  # mean padded length
        mfu = self.flops_at(length) * window.tokens_per_second() / self.peak[0]
        if mfu > 1 and self._remeasure is not None:
            self.remeasure_due = True
        return min(mfu, 1.0)

    def remeasure_if_due(self):
        """Between two windows: the peak measured again when an MFU passed 100% (once a run)."""
        if not self.remeasure_due:
            return
        self.remeasure_due, again, self._remeasure = False, self._remeasure, None
        before = self.peak[0]
        try:
            self.peak = again()
        except Exception as error:  # noqa: BLE001 - a figure, never a reason to stop a run
            logger.warning(f"MFU: the peak could not be measured again ({type(error).__name__}: {error})")
            return
        logger.info(
            f"MFU passed 100% against {before / 1e9:,.1f} GFLOP/s (measured on a busy machine?): the peak "
            f"measured again, now {self.peak[0] / 1e9:,.1f} GFLOP/s ({self.peak[1]}); MFU is at most 100%"
        )

    def figures(self, window):
        memory, peak_memory = memory_in_use()
        return {"memory_bytes": memory, "peak_memory_bytes": peak_memory, "mfu": self.mfu(window)}


def return_free_pages():
    """The C allocator's free pages given back to the system (glibc's `malloc_trim`), so that
    the resident memory read next is what the process holds. Nothing where the C library is
    not glibc: the memory is free for the process all the same."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
