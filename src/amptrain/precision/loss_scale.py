"""Dynamic loss scaling for float16 training, with its state in variables.

    scaler = DynamicLossScale(initial_scale=2**15, growth_interval=2000)
    scaled_loss = loss * scaler.scale              # in the replica step
    scaler.update(all_finite)                      # in the cross-replica context, once a step

The step is skipped by the engine when any replica's gradients were non-finite; here
the scale halves on such a step and doubles after `growth_interval` finite steps in a row.
"""

import tensorflow as tf


class DynamicLossScale(tf.Module):
    def __init__(self, initial_scale=2.0**15, growth_interval=2000, growth_factor=2.0, backoff_factor=0.5):
        super().__init__(name="loss_scale")
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.scale = tf.Variable(float(initial_scale), trainable=False, dtype=tf.float32, aggregation=aggregation)
        self.good_steps = tf.Variable(0, trainable=False, dtype=tf.int64, aggregation=aggregation)
        self.skipped_steps = tf.Variable(0, trainable=False, dtype=tf.int64, aggregation=aggregation)

    def update(self, all_finite):
        """Grows or backs off the scale after a step; returns nothing (graph-friendly)."""

        def finite():
            grow = self.good_steps + 1 >= self.growth_interval
            self.scale.assign(tf.where(grow, self.scale * self.growth_factor, self.scale))
            self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1))

        def overflow():
            self.scale.assign(self.scale * self.backoff_factor)
            self.good_steps.assign(0)
            self.skipped_steps.assign_add(1)

        tf.cond(all_finite, finite, overflow)
