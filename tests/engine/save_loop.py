"""Saves checkpoints in a loop until killed, each step's weights all equal to the step:
the process that `test_kill_during_save.py` kills with SIGKILL at random moments.

    python tests/engine/save_loop.py DIRECTORY MEGABYTES

A large extra variable makes each save take a while, so a kill lands inside one. Prints
`saved N` once `Checkpoints.save` has returned for step N (written and read back), and
`resumed N` first, from the checkpoint it resumed from.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amptrain.engine.checkpoints import Checkpoints  # noqa: E402


def build(directory, megabytes):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    ballast = tf.Variable(tf.zeros([megabytes * 2**18]))  # float32: 4 bytes each
    checkpoints = Checkpoints(directory, model, optimizer, step, {"ballast": ballast}, max_to_keep=3)
    return checkpoints, model, step, ballast


def consistent(model, ballast, step):
    """Every weight and the ballast hold the step they were saved at."""
    return all(np.all(v.numpy() == step) for v in [*model.trainable_variables, ballast])


def main():
    directory, megabytes = sys.argv[1], int(sys.argv[2])
    checkpoints, model, step, ballast = build(directory, megabytes)
    n = checkpoints.restore_latest()
    if n and not consistent(model, ballast, n):
        print(f"inconsistent {n}", flush=True)
        sys.exit(1)
    print(f"resumed {n}", flush=True)
    while True:
        n += 1
        step.assign(n)
        for v in [*model.trainable_variables, ballast]:
            v.assign(tf.fill(v.shape, float(n)))
        checkpoints.save()
        print(f"saved {n}", flush=True)


if __name__ == "__main__":
    main()
