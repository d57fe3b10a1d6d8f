"""The trainer's predict pass: the model's outputs batch by batch, on every replica, with
the forward pass compiled by XLA when `jit_compile` is on, under any strategy.

Over 2 logical CPUs (tests/engine/test_strategy_matrix.py, full tier) the compiled predict
step once failed: MirroredStrategy, handed a jit-compiled `tf.function` on devices that are
not all GPUs, compiles all replicas' calls as one cluster on the first device. Here, in
this process's one CPU, a MirroredStrategy over it takes that same code path. And its
training call, released once a run's steps are over, traces again if called.
"""

import weakref

import keras
import numpy as np
import tensorflow as tf
from poisoned import batches, poisoned_model, squared_error

from amptrain.engine.step_runner import StepRunner


def predicted(strategy, jit_compile):
    with strategy.scope():
        model = poisoned_model()
    trainer = StepRunner(strategy, model, None, None, jit_compile=jit_compile)
    outputs = trainer.predict(batches([[1, 1], [1, 1], [1, 1]]))
    return trainer, np.concatenate(outputs)


def test_predict_returns_every_batch_in_order():
    _, outputs = predicted(tf.distribute.get_strategy(), jit_compile=False)
    # Weights all ones: each output is 4 x (0.1 - 0.2 + 0.3) = 0.8, six examples in 3 batches of 2.
    np.testing.assert_allclose(outputs, np.full((6, 1), 0.8), rtol=1e-6)


def test_the_compiled_predict_step_runs_per_replica_under_mirrored():
    trainer, outputs = predicted(tf.distribute.MirroredStrategy(["/cpu:0"]), jit_compile=True)
    np.testing.assert_allclose(outputs, np.full((6, 1), 0.8), rtol=1e-6)
    # The jit-compiled function itself was traced and called by the replica; handed to
    # strategy.run directly it would have been cloned around the replicas (never traced).
    assert trainer._predict_step.experimental_get_tracing_count() >= 1


def trained(release_after=None, steps=3, jit_compile=False):
    model = poisoned_model()
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    trainer = StepRunner(tf.distribute.get_strategy(), model, optimizer, squared_error, jit_compile=jit_compile)
    iterator = iter(batches([[1, 1]] * steps))
    for step in range(steps):
        trainer.train(iterator, 1)
        if step == release_after:
            released = weakref.ref(trainer._train_loop)
            trainer.release_training()
            assert released() is None  # the traced call and its graphs are gone
    return [v.numpy() for v in model.trainable_variables + optimizer.variables]


def test_training_released_before_the_test_traces_again_and_goes_on_the_same():
    for jit_compile in (False, True):
        straight = trained(jit_compile=jit_compile)
        released = trained(release_after=0, jit_compile=jit_compile)
        assert all(np.array_equal(a, b) for a, b in zip(straight, released))
