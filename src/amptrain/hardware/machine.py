"""The machine the precision decision depends on (its candidates, the cache key of what it measured).

hardware = Hardware.detect()
hardware.describe()    # {"cpu": "...", "cores": 2, "cpu_flags": [...], "accelerators": [...]}
"""

import dataclasses
import os


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
