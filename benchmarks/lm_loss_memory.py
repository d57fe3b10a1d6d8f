"""The peak resident memory of a bare training step of `configs/lm-kjv.toml`'s language model
(4 layers, width 256, 4,096 pieces, batch 32 × 256), its loss made two ways: `whole`, a
log-softmax over the full float32 logits, and `chunked`, the model's own loss from `labels`
(a chunk of logits at a time, `tasks/language_model/cross_entropy.py`). Forward and
gradient only (no optimizer), three calls, random pieces; each row in a process of its own,
since a process's peak never falls.

    .venv/bin/python benchmarks/lm_loss_memory.py [--policies float32,mixed_bfloat16]

Prints a line a row: the loss a piece (both ways must agree) and the peak in MiB.
"""

import argparse
import resource
import subprocess
import sys

WAYS = ("whole", "chunked")


def one(way, policy):
    import numpy as np
    import tensorflow as tf

    from amptrain.tasks.language_model.model import LanguageModel

    tf.keras.utils.set_random_seed(0)
    sizes = {"num_layers": 4, "hidden_dim": 256, "num_heads": 4, "intermediate_dim": 1024, "dropout": 0.0}
    model = LanguageModel(4096, 256, sizes, policy)
    model.build()
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 4096, (32, 256)).astype(np.int32)
    labels = rng.integers(2, 4096, (32, 256)).astype(np.int32)
    positions = np.tile(np.arange(256, dtype=np.int32), (32, 1))
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "positions": positions}
    if way == "chunked":
        features["labels"] = labels

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            if way == "chunked":
                loss = outputs
            else:
                loss = -tf.reduce_sum(tf.gather(tf.nn.log_softmax(outputs), labels, batch_dims=2))
        return loss, tape.gradient(loss, model.trainable_variables)

    for _ in range(3):
        loss, _ = step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux: KiB
    print(f"{way:8s} {policy:15s} loss a piece {float(loss) / ids.size:.4f}  peak {peak:,} MiB", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="float32,mixed_bfloat16")
    parser.add_argument("--one", nargs=2, metavar=("WAY", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(*args.one)
    for policy in args.policies.split(","):
        for way in WAYS:
            subprocess.run([sys.executable, __file__, "--one", way, policy], check=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
