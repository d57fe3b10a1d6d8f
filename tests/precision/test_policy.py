"""`precision.policy = "auto"`: every hardware case of `select_policy`, by hand."""

import pytest

from amptrain.precision.policy import cpu_flags_from_proc, select_policy, uses_loss_scaling


def gpu(major, minor):
    return {"type": "GPU", "name": "/physical_device:GPU:0", "compute_capability": (major, minor)}


def test_a_named_policy_is_taken_as_asked():
    assert select_policy("mixed_float16", devices=[], cpu_flags=set()) == (
        "mixed_float16",
        "asked for in precision.policy",
    )
    assert select_policy("float32", devices=[gpu(9, 0)])[0] == "float32"


@pytest.mark.parametrize(
    "devices, expected, reason",
    [
        ([{"type": "TPU", "name": "/physical_device:TPU:0"}], "mixed_bfloat16", "TPU: bfloat16 is native"),
        ([gpu(8, 0)], "mixed_bfloat16", "GPU compute capability 8.0 >= 8.0: bf16 tensor cores"),
        ([gpu(9, 0)], "mixed_bfloat16", "GPU compute capability 9.0 >= 8.0: bf16 tensor cores"),
        ([gpu(7, 0)], "mixed_float16", "GPU compute capability 7.0: fp16 tensor cores, no bf16"),  # Volta
        ([gpu(7, 5)], "mixed_float16", "GPU compute capability 7.5: fp16 tensor cores, no bf16"),  # Turing
        ([gpu(6, 1)], "float32", "GPU compute capability 6.1 < 7.0: no tensor cores"),  # Pascal
        # Several GPUs: the weakest decides (an A100 beside a V100 gets fp16).
        ([gpu(8, 0), gpu(7, 0)], "mixed_float16", "GPU compute capability 7.0: fp16 tensor cores, no bf16"),
        # A GPU whose details TensorFlow could not read counts as no tensor cores.
        (
            [{"type": "GPU", "name": "/physical_device:GPU:0"}],
            "float32",
            "GPU compute capability 0.0 < 7.0: no tensor cores",
        ),
    ],
)
def test_auto_on_accelerators(devices, expected, reason):
    # A TPU or GPU decides; the CPU's flags do not matter then.
    assert select_policy("auto", devices=devices, cpu_flags={"amx_bf16"} if expected == "float32" else set()) == (
        expected,
        reason,
    )


@pytest.mark.parametrize(
    "flags, expected, reason",
    [
        ({"avx2", "fma"}, "float32", "CPU without AVX512_BF16 or AMX: half precision is emulated, not faster"),
        (set(), "float32", "CPU without AVX512_BF16 or AMX: half precision is emulated, not faster"),
        ({"avx512f", "avx512_bf16"}, "mixed_bfloat16", "CPU with avx512_bf16"),
        ({"amx_bf16"}, "mixed_bfloat16", "CPU with amx_bf16"),
        ({"avx512_bf16", "amx_bf16", "avx512_fp16"}, "mixed_bfloat16", "CPU with amx_bf16 and avx512_bf16"),
    ],
)
def test_auto_on_a_cpu_never_picks_float16(flags, expected, reason):
    assert select_policy("auto", devices=[], cpu_flags=flags) == (expected, reason)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16\n\nflags\t\t: other\n")
    assert cpu_flags_from_proc(str(cpuinfo)) == {"fpu", "avx2", "avx512_bf16"}  # the first processor's
    assert cpu_flags_from_proc(str(tmp_path / "missing")) == set()


def test_only_float16_scales_the_loss():
    assert uses_loss_scaling("mixed_float16")
    assert not uses_loss_scaling("mixed_bfloat16") and not uses_loss_scaling("float32")
