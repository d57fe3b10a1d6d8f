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

    with xla_modes.scope(mode):     # around the ops of a step's forward and backward pass
        ...
    xla_modes.whole(mode)           # the `jit_compile` argument of the step's tf.functions
    xla_modes.uses_xla(mode)        # True for true and "fusible" (check-numerics turns both off)
"""

import contextlib

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


def scope(mode):
    """A context in which the ops built are compiled by XLA under "fusible" (but the
    matrix products); no effect under the other modes."""
    if mode != "fusible":
        return contextlib.nullcontext()
    import tensorflow as tf

    # One scope for the forward ops and their gradients, so XLA may fuse across them.
    return tf.xla.experimental.jit_scope(compile_ops=_compiled, separate_compiled_gradients=False)


def describe(mode):
    """The mode as logs and tables show it."""
    return {True: "on", False: "off", "fusible": "fusible"}[mode]
