"""Grouped-query attention's forward and backward pass at SmolLM2-135M's shape (9 query heads
reading 3 key-value heads of 64) in bfloat16, three ways: keras-hub's (keys and values repeated
to every query head, two einsums), one five-axis einsum per product, and the query group's rows
stacked for one batched matrix product a key-value head (families/lean_layer.py).

    .venv/bin/python benchmarks/grouped_attention.py [--batch 8] [--positions 128] [--repeats 100]

Prints the median milliseconds of each, in turns, three rounds.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

HEADS, KV_HEADS, SIZE = 9, 3, 64
GROUP = HEADS // KV_HEADS


def repeated(q, k, v):
    k, v = tf.repeat(k, GROUP, axis=2), tf.repeat(v, GROUP, axis=2)
    p = tf.cast(tf.nn.softmax(tf.cast(tf.einsum("bquh,bkuh->buqk", q, k), tf.float32)), q.dtype)
    return tf.einsum("buqk,bkuh->bquh", p, v)


def five_axes(q, k, v):
    b, t = q.shape[:2]
    g = tf.reshape(q, (b, t, KV_HEADS, GROUP, SIZE))
    p = tf.cast(tf.nn.softmax(tf.cast(tf.einsum("btkgd,bskd->bkgts", g, k), tf.float32)), q.dtype)
    return tf.reshape(tf.einsum("bkgts,bskd->btkgd", p, v), (b, t, HEADS, SIZE))


def stacked_rows(q, k, v):
    b, t = q.shape[:2]
    rows = tf.transpose(tf.reshape(q, (b, t, KV_HEADS, GROUP, SIZE)), (0, 2, 3, 1, 4))
    rows = tf.reshape(rows, (b, KV_HEADS, GROUP * t, SIZE))
    s = tf.matmul(rows, tf.transpose(k, (0, 2, 1, 3)), transpose_b=True)
    p = tf.cast(tf.nn.softmax(tf.cast(s, tf.float32)), q.dtype)
    o = tf.matmul(p, tf.transpose(v, (0, 2, 1, 3)))
    return tf.reshape(tf.transpose(tf.reshape(o, (b, KV_HEADS, GROUP, t, SIZE)), (0, 3, 1, 2, 4)), (b, t, HEADS, SIZE))


def timed(function, tensors, repeats):
    @tf.function
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(tf.cast(function(q, k, v), tf.float32))
        return tape.gradient(loss, [q, k, v])

    step(*tensors)[0].numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(*tensors)[0].numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    b, t = args.batch, args.positions
    tensors = [tf.constant(rng.normal(size=(b, t, h, SIZE)), tf.bfloat16) for h in (HEADS, KV_HEADS, KV_HEADS)]
    for round_ in range(3):
        for name, function in [("repeated", repeated), ("five_axes", five_axes), ("stacked_rows", stacked_rows)]:
            print(f"round {round_ + 1} {name:13s} {timed(function, tensors, args.repeats):6.2f} ms", flush=True)


if __name__ == "__main__":
    main()
