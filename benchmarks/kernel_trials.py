"""The layers' elementwise chains op by op against each as XLA computations of its own
(`xla_modes.kernel`, what `runtime.fused_kernels` does in a training step), forward and
backward at the reference shape's sizes (batch 32, sequence 128, hidden 256, FFN 1,024,
4 heads), medians of 9 rounds of 5 calls, both variants in one process:

- the exact GELU (32 x 128 x 1,024): amptrain's `models.lean.gelu`, kept as kernels;
- layer norm (32 x 128 x 256), the attention softmax to bfloat16 (32 x 4 x 128 x 128) and
  dropout's mask at 0.1 (both sizes): the trials below, not kept (docs/benchmarks.md).

    .venv/bin/python benchmarks/kernel_trials.py [--dtype bfloat16]

The trials are `models/lean.py`'s and `models/dropout.py`'s own arithmetic with each forward
and backward body made a kernel.
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import tensorflow as tf  # noqa: E402

from amptrain import xla_modes  # noqa: E402
from amptrain.models import dropout, lean  # noqa: E402

kernel = xla_modes.kernel


@kernel
def _normalize(x, gamma, beta, epsilon):
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    inverse = tf.math.rsqrt(variance + epsilon)
    return tf.cast((x32 - mean) * inverse * gamma + beta, x.dtype), mean, inverse


@kernel
def _normalize_gradient(x, mean, inverse, gamma, dy):
    normed = (tf.cast(x, tf.float32) - mean) * inverse
    dy32 = tf.cast(dy, tf.float32)
    outer = tf.range(tf.rank(dy32) - 1)
    dnormed = dy32 * gamma
    dx = inverse * (
        dnormed
        - tf.reduce_mean(dnormed, axis=-1, keepdims=True)
        - normed * tf.reduce_mean(dnormed * normed, axis=-1, keepdims=True)
    )
    return tf.cast(dx, x.dtype), tf.reduce_sum(dy32 * normed, axis=outer), tf.reduce_sum(dy32, axis=outer)


def layer_norm_trial(x, gamma, beta, epsilon=1e-6):
    @tf.custom_gradient
    def forward(x, gamma, beta):
        y, mean, inverse = _normalize(x, gamma, beta, epsilon)
        return y, lambda dy: _normalize_gradient(x, mean, inverse, gamma, dy)

    return forward(x, gamma, beta)


@kernel
def _softmax(scores, dtype):
    return tf.cast(tf.nn.softmax(scores, axis=-1), dtype)


@kernel
def _softmax_gradient(probabilities, dprobabilities):
    p, g = tf.cast(probabilities, tf.float32), tf.cast(dprobabilities, tf.float32)
    return p * (g - tf.reduce_sum(g * p, axis=-1, keepdims=True))


def softmax_trial(scores, dtype):
    @tf.custom_gradient
    def forward(scores):
        probabilities = _softmax(scores, dtype)
        return probabilities, lambda dp: _softmax_gradient(probabilities, dp)

    return forward(scores)


@kernel
def _masked(x, words, count, scale):
    halves = tf.reshape(tf.bitcast(words, tf.uint16), (-1,))[: tf.size(x)]
    keep = tf.reshape(halves, tf.shape(x)) >= tf.constant(count, tf.uint16)
    return x * tf.cast(scale, x.dtype) * tf.cast(keep, x.dtype)


def dropout_trial(x, seed, rate=0.1):
    count, probability = dropout.drop_threshold(rate)
    size = tf.reshape((tf.size(x) + 1) // 2, (1,))
    words = tf.random.stateless_uniform(size, seed, minval=None, maxval=None, dtype=tf.uint32)
    scale = 1.0 / (1.0 - probability)

    @tf.custom_gradient
    def forward(x):  # keeps the random words, two bytes an element
        return _masked(x, words, count, scale), lambda dy: _masked(dy, words, count, scale)

    return forward(x)


def dropout_now(x, seed, rate=0.1):
    """`models.dropout.Dropout`'s arithmetic as it runs op by op."""
    count, probability = dropout.drop_threshold(rate)
    keep = dropout.keep_mask(tf.shape(x), rate, seed)
    return x * tf.cast(1.0 / (1.0 - probability), x.dtype) * tf.cast(keep, x.dtype)


def pieces(dtype):
    """{name: (op-by-op function, trial function or None for lean's own kernels, shape)}."""
    gamma = tf.linspace(0.5, 1.5, 256)
    beta = tf.linspace(-1.0, 1.0, 256)
    seed = tf.constant([1, 2])
    return {
        "gelu": (lean.gelu, None, (32, 128, 1024)),
        "layer norm": (
            lambda x: lean._layer_norm(x, gamma, beta, 1e-6),
            lambda x: layer_norm_trial(x, gamma, beta),
            (32, 128, 256),
        ),
        "softmax": (
            lambda x: lean.softmax_to(tf.cast(x, tf.float32), dtype),
            lambda x: softmax_trial(tf.cast(x, tf.float32), tf.as_dtype(dtype)),
            (32, 4, 128, 128),
        ),
        "dropout, residual": (lambda x: dropout_now(x, seed), lambda x: dropout_trial(x, seed), (32, 128, 256)),
        "dropout, attention": (lambda x: dropout_now(x, seed), lambda x: dropout_trial(x, seed), (32, 4, 128, 128)),
    }


def timed(function, kernels, x):
    @tf.function(autograph=False)
    def call(x):
        with xla_modes.scope(False, kernels):  # as the step runner builds a training step
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.cast(function(x), tf.float32))
            return tape.gradient(loss, x)

    call(x)
    rounds = []
    for _ in range(9):
        start = time.perf_counter()
        for _ in range(5):
            gradient = call(x)
        gradient.numpy()
        rounds.append((time.perf_counter() - start) / 5 * 1e3)
    return statistics.median(rounds)


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    print(f"{args.dtype}, forward and backward, ms (median of 9 rounds of 5 calls)")
    for name, (now, trial, shape) in pieces(args.dtype).items():
        x = tf.cast(tf.random.stateless_normal(shape, [1, 2]), args.dtype)
        op_by_op = timed(now, False, x)
        as_kernels = timed(now, True, x) if trial is None else timed(trial, True, x)
        print(f"{name:20s} op by op {op_by_op:7.2f}   as kernels {as_kernels:7.2f}")


if __name__ == "__main__":
    main()
