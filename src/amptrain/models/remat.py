"""Recomputation: a Transformer block keeps only its inputs for the backward pass and runs its
forward pass again there, trading about one more forward pass for the activations of every
block but the one being differentiated (`model.remat = "blocks"`).

    x = recomputed(block, lambda x: block.body(x, mask, training=True), x)

`tf.recompute_grad` around a closure that takes the block's floating-point inputs
positionally: both it in graph mode and Keras's `RematScope` fail on keyword arguments
(keras-team/keras#21207, tensorflow/tensorflow#56692), and a mask or a flag is captured by
the closure instead. Dropout draws the same masks twice: the forward pass's seeds are recorded
by each `models.dropout.Dropout` inside the block and replayed, in order, by the backward
pass's recomputation, so the step's loss and gradients equal those without recomputation
(tests/test_remat.py), and the seed generators advance once a step, as without it.
"""

import tensorflow as tf

from amptrain.models.dropout import Dropout

MODES = ("none", "blocks")


class _Seeds:
    """The seeds one dropout layer drew in a block's forward pass, replayed by its recomputation."""

    def __init__(self):
        self.seeds, self.replaying, self.position = [], False, 0

    def record(self, seed):
        self.seeds.append(seed)

    def next(self):
        seed = self.seeds[self.position]
        self.position += 1
        return seed


def recomputed(layer, forward, *tensors):
    """`forward(*tensors)`, with only `tensors` kept for the backward pass, which runs
    `forward` again; `layer`'s dropout layers draw the same masks both times."""
    dropouts = [d for d in layer._flatten_layers(include_self=False) if isinstance(d, Dropout)]
    states = [_Seeds() for _ in dropouts]
    runs = []

    def run(*inputs):
        for dropout, state in zip(dropouts, states):
            dropout._seeds, state.replaying, state.position = state, bool(runs), 0
        runs.append(True)
        try:
            return forward(*inputs)
        finally:
            for dropout in dropouts:
                dropout._seeds = None

    return tf.recompute_grad(run)(*tensors)


def check_mode(value, where="model.remat"):
    if value not in MODES:
        raise ValueError(f"{where}: expected one of {', '.join(MODES)}, received {value!r}")
