"""What `auto` may choose among on this machine, and what it chooses without measuring.

    hardware = Hardware.detect()
    found, excluded = candidates(config.precision, config.runtime, hardware)   # in preference order, {label: why not}
    chosen, why = rule(config.precision, config.runtime, hardware)             # the hardware rule: no measurement

The preference order is the tie rule's (`probe.choose`): float32 before bf16 before fp16,
XLA off before on. `measuring_order` is the order the probe builds them in: the rule's
choice first (a run too short to repay more keeps it, already built), then the other
policies without XLA, then the XLA modes, whose bound the first timings give.
"""

import dataclasses

from amptrain.config.sections import CONCRETE_POLICIES

SHORT_NAMES = {"float32": "float32", "mixed_bfloat16": "bf16", "mixed_float16": "fp16"}


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


def candidates(p, r, hardware):
    """([Candidate] in preference order, {label: why it is not tried}) of the `[precision]`
    and `[runtime]` sections `p` and `r` on `hardware`."""
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


def rule(p, r, hardware):
    """(Candidate, why) without measuring: the hardware rule (`policy.select_policy`)
    within `precision.allow`, and XLA on accelerators only. On a CPU XLA is off: its
    compilation does not pay on a short run, and on AMX it turns bf16 products into
    float32 ones. `p`, `r`: the `[precision]` and `[runtime]` sections."""
    from amptrain.precision.policy import select_policy

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


def measuring_order(found, first):
    """`found` in the order the probe builds them: `first` (the rule's choice), then the
    other candidates without XLA, then those with it (their bound needs their policy's
    timing without XLA, `measurement.Budget.verdict`)."""
    rest = [c for c in found if c != first]
    head = [first] if first in found else []
    return head + [c for c in rest if not c.jit_compile] + [c for c in rest if c.jit_compile]
