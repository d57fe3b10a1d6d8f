"""Saves checkpoints in a loop until killed, each step's weights all equal to the step:
the process that `test_kill_during_save.py` kills with SIGKILL at random moments.

    python tests/engine/save_loop.py DIRECTORY MEGABYTES
    python tests/engine/save_loop.py --zygote DIRECTORY MEGABYTES

The second form pays TensorFlow's import once: it reads `fork OUTPUT` lines on stdin and for
each forks a child that runs the loop with its stdout in the file OUTPUT, answering `pid N`.
The child is a whole process that the test kills with SIGKILL like the first form's; what
it skips is only the import (seven seconds of twenty trials), since no TensorFlow runtime
exists in the parent to be shared (it runs no op before forking).

A large extra variable makes each save take a while, so a kill lands inside one. Prints
`saved N` once `Checkpoints.save` has returned for step N (written and read back), and
`resumed N` first, from the checkpoint it resumed from.
"""

import os
import signal
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


def loop(directory, megabytes):
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


def zygote(directory, megabytes):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the killed children
    for line in sys.stdin:
        output = line.split(maxsplit=1)[1].strip()
        pid = os.fork()
        if pid == 0:
            with open(output, "w") as f:
                os.dup2(f.fileno(), sys.stdout.fileno())
            loop(directory, megabytes)
        print(f"pid {pid}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote(sys.argv[2], int(sys.argv[3]))
    else:
        loop(sys.argv[1], int(sys.argv[2]))
