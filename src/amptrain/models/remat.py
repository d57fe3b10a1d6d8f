"""Recomputation: a Transformer block keeps only its inputs for the backward pass and runs its
forward pass again there, trading about one more forward pass for the activations of every
block but the one being differentiated (`model.remat = "blocks"`).

    x = recomputed(block, lambda x: block._body(x, mask, True), x)   # a block's call when training

`tf.recompute_grad` around a closure that takes the block's floating-point inputs
positionally: both it in graph mode and Keras's `RematScope` fail on keyword arguments
(keras-team/keras#21207, tensorflow/tensorflow#56692), and a mask or a flag is captured by
the closure instead. Dropout draws the same masks twice: the seeds each Keras seed generator
inside the block gives in the forward pass are recorded and replayed, in order, by the
backward pass's recomputation, so the step's loss and gradients equal those without it
(tests/models/test_remat.py), and the generators advance once a step, as without it.
`remat(layer)` does the same for a layer of a user's model (`amptrain.remat`).

Every op of the block waits for its inputs, which the recomputation's inputs do for the
upstream gradient (TensorFlow ties them): an op that reads only weights (a frozen kernel's
cast or dequantization) would otherwise be ready, and run, at the step's start, and be held
until the backward pass reached its block: a whole base in the compute dtype (SmolLM2 on an
int8 base peaked 140 MiB higher recomputed than not).
"""

import tensorflow as tf

from amptrain.errors import UserError


class _Seeds:
    """The seeds one Keras seed generator gave in a block's forward pass, replayed in order by
    the backward pass's recomputation (`next` patched on the generator while the block runs)."""

    def __init__(self, generator):
        self.generator, self.original = generator, generator.next
        self.seeds, self.replaying, self.position = [], False, 0

    def next(self, ordered=True):
        if self.replaying:
            seed = self.seeds[self.position]
            self.position += 1
            return seed
        seed = self.original(ordered)
        self.seeds.append(seed)
        return seed


def _generators(layer):
    return [g for sub in layer._flatten_layers(include_self=True) for g in getattr(sub, "_seed_generators", [])]


def recomputed(layer, forward, *tensors):
    """`forward(*tensors)`, with only `tensors` kept for the backward pass, which runs
    `forward` again; every seed generator of `layer` and its sublayers (dropout's) gives the
    same seeds both times, and advances once."""
    states = [_Seeds(generator) for generator in _generators(layer)]
    runs = []

    def run(*inputs):
        for state in states:
            state.replaying, state.position = bool(runs), 0
            state.generator.next = state.next
        runs.append(True)
        try:
            with tf.control_dependencies(inputs):  # its reads of weights too (below)
                return forward(*inputs)
        finally:
            for state in states:
                del state.generator.next  # the class's own again

    return tf.recompute_grad(run)(*tensors)


def remat(layer):
    """`layer` (a Keras layer of yours whose `call` takes `training`, a Transformer block say)
    recomputed in the backward pass when training: it keeps only its floating-point positional
    inputs; other arguments (masks, flags) are held by a closure. Returns the layer.

        block = amptrain.remat(MyBlock(...))"""
    import inspect

    if "training" not in inspect.signature(layer.call).parameters:
        raise UserError(f"remat: {layer.name}.call takes no `training` argument, so a forward pass is not told apart")
    call = layer.call

    def recomputing_call(*args, **kwargs):
        floating = [i for i, a in enumerate(args) if tf.is_tensor(a) and a.dtype.is_floating]
        if not kwargs.get("training") or not floating:
            return call(*args, **kwargs)

        def forward(*tensors):
            given = list(args)
            for index, tensor in zip(floating, tensors):
                given[index] = tensor
            return call(*given, **kwargs)

        return recomputed(layer, forward, *(args[i] for i in floating))

    layer.call = recomputing_call
    return layer
