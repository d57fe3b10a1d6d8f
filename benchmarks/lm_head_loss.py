"""The head and loss of a language-model training step alone: the fused cross-entropy
(`tasks/language_model/cross_entropy.py`) forward and its gradient to the states, at
SmolLM2-135M's shape by default (8 × 128 positions, width 576, 49,152 pieces, a frozen
table as under LoRA), with its products in float32 and in bfloat16, and chunks of 8 and 32
MiB of float32 logits. The variants are timed round by round in one process (medians).

    .venv/bin/python benchmarks/lm_head_loss.py [--rows 1024] [--hidden 576] [--vocabulary 49152] [--rounds 7]

Prints a line a variant: the median milliseconds of a call, the summed loss and the largest
difference of the states' gradient from float32 products at 8 MiB.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocabulary", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import tensorflow as tf

    from amptrain import xla_modes
    from amptrain.tasks.language_model import cross_entropy

    tf.keras.utils.set_random_seed(0)
    # states as a bfloat16 network hands them over; a table of a trained model's scale
    states = tf.Variable(tf.cast(tf.cast(tf.random.normal((args.rows, args.hidden)), tf.bfloat16), tf.float32))
    table = tf.Variable(tf.random.normal((args.vocabulary, args.hidden)) * 0.5, trainable=False)
    labels = tf.random.uniform((args.rows,), 0, args.vocabulary, dtype=tf.int32)

    def variant(products, chunk):
        cross_entropy.CHUNK_ELEMENTS = chunk  # read when the call is traced

        @tf.function
        def call():
            with xla_modes.scope(False, kernels=True), tf.GradientTape() as tape:  # as in a training step
                loss = cross_entropy.summed_cross_entropy(states, tf.identity(table), labels, False, products)
            return loss, tape.gradient(loss, states)

        call()
        return call

    names = [(products, chunk) for products in ("float32", "bfloat16") for chunk in (1 << 21, 1 << 23)]
    calls = {name: variant(*name) for name in names}
    times = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            call()[1].numpy()
            times[name].append(time.perf_counter() - started)
    _, reference = calls[names[0]]()
    for name in names:
        loss, gradient = calls[name]()
        difference = float(tf.reduce_max(tf.abs(gradient - reference)))
        took = statistics.median(times[name]) * 1000
        print(
            f"products {name[0]:<8} chunks of {name[1] * 4 >> 20:2} MiB: {took:6.0f} ms"
            f"  loss {float(loss):,.2f}  gradient differs by {difference:.1e}"
        )


if __name__ == "__main__":
    main()
