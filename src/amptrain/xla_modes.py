"""How XLA takes part in a run's step: `runtime.jit_compile`.

    true       the forward and backward pass is one XLA computation (on one device the
               whole step: the update, the scaler, the counters too)
    false      no XLA: TensorFlow's executor runs the graph op by op (oneDNN's kernels on a CPU)
    "fusible"  XLA compiles everything of the forward and backward pass but its matrix
               products: the chains of elementwise ops and reductions between them (casts,
               GELU, dropout's masks, the softmax and layer-norm arithmetic) become a few
               fused loops, and the matrix products stay TensorFlow's own kernels

Why a third mode: on a Xeon with AMX, oneDNN runs a bfloat16 matrix product on the AMX
units, but XLA:CPU in this TensorFlow build rewrites every bf16 dot to convert, float32
dot, convert (slower than float32 alone), so bf16 pays only without XLA; and without XLA
every elementwise op is a kernel of its own that reads and writes the whole tensor.

How: the ops are built inside `tf.xla.experimental.jit_scope(compile_ops=...)`, which
marks each op but the matrix products `_XlaCompile`; TensorFlow's clustering pass turns
the marked ops into XLA clusters when the function is instantiated. Per function, not
process-wide: TensorFlow's auto-clustering (`tf.config.optimizer.set_jit`, TF_XLA_FLAGS)
would do the same for every graph of the process, and switching it re-instantiates
every function without bringing its clusters back (tried: a trainer built under it ran
without XLA after one switch off and on), which the probe, timing candidates in turns,
cannot have.

Kernels (`runtime.fused_kernels`, on by default): an elementwise chain of amptrain's layers
that XLA runs faster than TensorFlow's executor is a `kernel` function (the exact GELU's
forward and backward: models/lean.py). Built inside a training step's `scope` with kernels
on, each is a small XLA computation of its own, also under `jit_compile = false`: one fused
loop instead of an executor kernel per op (the GELU's forward and backward at 4,096 x
1,024: 24.7 ms op by op in bfloat16, 10.7 as kernels; benchmarks/gelu_bf16.py). Elsewhere
(evaluation, export, the audit's trace, check-numerics, a step compiled whole) they are the
same ops, op by op. Layer norm, softmax and dropout were slower or no faster as kernels
(benchmarks/kernel_trials.py).

    with xla_modes.scope(mode, kernels=True):   # around a step's forward and backward pass
        ...
    xla_modes.whole(mode)           # the `jit_compile` argument of the step's tf.functions
    xla_modes.uses_xla(mode)        # True for true and "fusible" (check-numerics turns both off)
"""

import contextlib
import functools
import threading

MODES = (True, False, "fusible")
# What stays out of XLA under "fusible": the ops oneDNN (on a GPU, cuBLAS) runs as matrix
# products. A gradient of one is again one of these.
MATRIX_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})
# Random-number ops stay out too. In clusters, dropout's random ops (the seed changes every
# step) made every graph call take about 5 s instead of 0.2 (spam config at hidden 64,
# bf16, dropout 0.1), though the device compiler logged no new compile; the cause was
# not found. Outside XLA they are TensorFlow's kernels, so the masks are those of
# `jit_compile = false` (tests/engine/test_xla_modes.py compares them).
RANDOM_PREFIXES = ("StatelessRandom", "StatelessTruncated", "Random", "Rng", "StatelessMultinomial")


def whole(mode):
    """True when XLA compiles the whole forward and backward pass (`jit_compile = true`)."""
    return mode is True


def uses_xla(mode):
    """True when XLA compiles any of the step: `true` or "fusible"."""
    return mode is True or mode == "fusible"


def _compiled(node_def):
    return node_def.op not in MATRIX_PRODUCTS and not node_def.op.startswith(RANDOM_PREFIXES)


@contextlib.contextmanager
def scope(mode, kernels=False):
    """A context in which the ops built are compiled by XLA under "fusible" (but the
    matrix products), and in which `kernel` functions are XLA computations of their own
    when `kernels` is true and the step is not compiled whole."""
    previous = getattr(_kernels, "on", False)
    _kernels.on = bool(kernels) and not whole(mode)
    try:
        if mode != "fusible":
            yield
            return
        import tensorflow as tf

        # One scope for the forward ops and their gradients, so XLA may fuse across them.
        with tf.xla.experimental.jit_scope(compile_ops=_compiled, separate_compiled_gradients=False):
            yield
    finally:
        _kernels.on = previous


# Per thread: a mirrored strategy traces each replica's step in a thread of its own, inside
# the replica's own `scope`.
_kernels = threading.local()


def kernel(function):
    """`function` (tensors and Python constants in, tensors out: a chain of elementwise ops
    and reductions) as one XLA computation when it is called while a step is built inside
    `scope(mode, kernels=True)`, op by op anywhere else (an exported model, the audit's
    trace, check-numerics, a step compiled whole). One fused loop reads and writes each
    tensor once, where TensorFlow's executor runs every op as a kernel of its own."""
    compiled = []

    @functools.wraps(function)
    def call(*args):
        if not getattr(_kernels, "on", False):
            return function(*args)
        if not compiled:
            import tensorflow as tf

            compiled.append(tf.function(function, jit_compile=True, autograph=False))
        return compiled[0](*args)

    return call


def describe(mode):
    """The mode as logs and tables show it."""
    return {True: "on", False: "off", "fusible": "fusible"}[mode]
