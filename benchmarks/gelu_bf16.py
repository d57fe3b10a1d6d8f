"""The exact GELU's forward and backward pass at the bf16 issue's feed-forward shape (32 x 128
rows of 1,024), in one process, the variants taken in turn (medians of 9 rounds of 5 calls):
amptrain's `models.lean.gelu` op by op (erfc in the input's dtype) and as a training step
builds it (`runtime.fused_kernels`: its forward and backward as two XLA computations), the
op-by-op one with erfc taken in float32 (a trial not kept: docs/benchmarks.md), TensorFlow's
exact and tanh GELUs; and each one's largest error against float64.

    .venv/bin/python benchmarks/gelu_bf16.py [--dtype bfloat16] [--rows 4096] [--width 1024]
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def erfc_in_float32(x):
    """`models.lean.gelu` with its erfc taken in float32 under a half-precision input (the
    trial: Eigen's erfc of bfloat16 runs an element at a time), forward and backward."""
    import tensorflow as tf

    from amptrain.models.lean import after

    def cdf(x):
        return tf.cast(0.5 * tf.math.erfc(tf.cast(x, tf.float32) * -0.7071067811865476), x.dtype)

    @tf.custom_gradient
    def forward(x):
        def backward(dy):
            with after(dy):  # as lean.gelu: recomputed once the gradient arrives, not kept
                half, scale = tf.cast(0.5, x.dtype), tf.cast(0.3989422804014327, x.dtype)
                return dy * (cdf(x) + x * (tf.exp(-half * x * x) * scale))

        return x * cdf(x), backward

    return forward(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, default=32 * 128)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    import tensorflow as tf

    from amptrain.models.lean import gelu

    x = tf.cast(tf.random.stateless_normal([args.rows, args.width], [1, 2]), args.dtype)
    dy = tf.cast(tf.random.stateless_normal([args.rows, args.width], [3, 4]), args.dtype)
    variants = {
        "amptrain gelu": gelu,
        "as kernels": gelu,
        "erfc in float32": erfc_in_float32,
        "tf.nn exact": lambda v: tf.nn.gelu(v, approximate=False),
        "tf.nn tanh": lambda v: tf.nn.gelu(v, approximate=True),
    }
    calls = {name: step(f, kernels=name == "as kernels") for name, f in variants.items()}
    for call in calls.values():
        call(x, dy)
    times = {name: [] for name in calls}
    for _ in range(9):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(5):
                out = call(x, dy)
            out[1].numpy()
            times[name].append((time.perf_counter() - start) / 5)
    exact = tf.nn.gelu(tf.cast(x, tf.float64), approximate=False)
    print(f"{args.dtype} ({args.rows} x {args.width}), forward and backward, ms (median of 9)")
    for name, call in calls.items():
        error = float(tf.reduce_max(tf.abs(tf.cast(call(x, dy)[0], tf.float64) - exact)))
        print(f"{name:14s} {sorted(times[name])[4] * 1e3:7.2f}   max |y - float64 exact| {error:.2e}")


def step(function, kernels=False):
    import tensorflow as tf

    from amptrain import xla_modes

    @tf.function
    def call(x, dy):
        with xla_modes.scope(False, kernels):  # as the step runner builds a training step
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = function(x)
            return y, tape.gradient(y, x, output_gradients=dy)

    return call


if __name__ == "__main__":
    main()
