"""An exponential moving average of the trainable weights (`train.ema_decay`).

    with strategy.scope():
        average = WeightAverage(strategy, model.trainable_variables, decay=0.99)
    average.update()              # in the cross-replica context, after each applied step
    with average.applied():       # the model holds the averaged weights inside
        evaluate(...)

The definition, with decay d, weights w_1, w_2, ... after each applied step:

    a_0 = 0,   a_n = d * a_{n-1} + (1 - d) * w_n,   average = a_n / (1 - d**n)

so the average is a proper weighted mean of w_1..w_n (weights proportional to d**(n-i))
with nothing of the random initial weights in it: after two steps it is
(d * w_1 + w_2) / (1 + d). A skipped step updates nothing (the weights did not move).

The raw sums `a_n` and the count `n` are variables, checkpointed with the model, so a
resumed run goes on with the same average. They are created under the strategy's scope
(mirrored like the weights) and updated in the cross-replica context with
`strategy.extended.update`, which runs the update on every copy with that device's copy of
the weight.
"""

import contextlib

import keras
import tensorflow as tf


def _tf_variable(variable):
    """The TensorFlow (possibly distributed) variable behind a Keras variable."""
    return variable.value if isinstance(variable, keras.Variable) else variable


class WeightAverage:
    def __init__(self, strategy, variables, decay):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), received {decay!r}")
        self.strategy = strategy
        self.decay = float(decay)
        self._variables = list(variables)
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.sums = [
            tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"average_{i}", aggregation=aggregation)
            for i, v in enumerate(self._variables)
        ]
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="average_updates", aggregation=aggregation)
        # What a checkpoint holds: the sums and the count, not the weights (the model's own).
        self.trackable = tf.Module(name="weight_average")
        self.trackable.sums = self.sums
        self.trackable.updates = self.updates

    def update(self):
        """a <- d * a + (1 - d) * w for every weight; call in the cross-replica context after
        the optimizer's apply (inside a `tf.function`, automatic control dependencies order
        the reads of the weights after the optimizer's writes)."""
        d = self.decay

        def step(total, weight):
            return total.assign(d * total + (1.0 - d) * tf.cast(weight, tf.float32))

        for total, variable in zip(self.sums, self._variables):
            self.strategy.extended.update(total, step, args=(_tf_variable(variable),))
        self.updates.assign_add(1)

    def averaged_values(self):
        """The bias-corrected averages as numpy arrays (the raw weights' values before any update)."""
        n = int(self.updates.numpy())
        if n == 0:
            return [v.numpy() for v in self._variables]
        correction = 1.0 - self.decay**n
        return [total.numpy() / correction for total in self.sums]

    @contextlib.contextmanager
    def applied(self):
        """The model holds the averaged weights inside the block, its own weights again after it."""
        backup = [v.numpy() for v in self._variables]
        try:
            for variable, value in zip(self._variables, self.averaged_values()):
                variable.assign(value)
            yield
        finally:
            for variable, value in zip(self._variables, backup):
                variable.assign(value)
