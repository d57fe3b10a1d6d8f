"""Loss scaling, dynamic or fixed, with every piece of its state in checkpointed variables.

    scaler = build_scaler(config.precision, policy)   # None when the run needs none
    scaled_loss = loss * scaler.scale                 # in the replica step
    at_floor = scaler.update(loss_finite, grads_finite)  # cross-replica, once a step

The engine skips a step whose all-reduced gradients are non-finite (every replica's
inf reaches the sum, so the decision is the same everywhere); here the scale reacts:

- a clean step counts towards growth: after `growth_interval` clean steps in a row the
  scale is multiplied by `growth_factor`, but never past `max_scale` (a scale already
  above it, set by `initial_scale`, stays where it is);
- an overflowing step (finite loss, non-finite gradients) resets the growth count and
  adds one to the overflow streak; once the streak reaches `hysteresis`, that step and
  every further overflowing one until a clean step multiply the scale by
  `backoff_factor`, never below `min_scale`;
- a step whose loss itself is non-finite changes nothing here: no scale can mend the
  forward pass, so the engine's NaN policy (`train.on_nonfinite`) deals with it;
- a fixed scale never moves; overflows are still counted.

`update` returns True for an overflow with the scale already at `min_scale`: backing
off can do nothing more, and the engine stops the run with a diagnosis.
"""

import tensorflow as tf

from amptrain.precision.policy import uses_loss_scaling


def build_scaler(precision, policy):
    """The scaler `precision.loss_scale` asks for under `policy`, or None."""
    mode = precision.loss_scale
    if mode == "auto":
        mode = "dynamic" if uses_loss_scaling(policy) else "none"
    if mode == "none":
        return None
    if mode == "dynamic":
        return LossScaler(
            precision.initial_scale,
            dynamic=True,
            growth_interval=precision.growth_interval,
            growth_factor=precision.growth_factor,
            backoff_factor=precision.backoff_factor,
            hysteresis=precision.hysteresis,
            min_scale=precision.min_scale,
            max_scale=precision.max_scale,
        )
    return LossScaler(float(mode), dynamic=False, min_scale=precision.min_scale, max_scale=precision.max_scale)


class LossScaler(tf.Module):
    def __init__(
        self,
        initial_scale=2.0**15,
        dynamic=True,
        growth_interval=2000,
        growth_factor=2.0,
        backoff_factor=0.5,
        hysteresis=1,
        min_scale=1.0,
        max_scale=2.0**24,
    ):
        super().__init__(name="loss_scale")
        self.dynamic = dynamic
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.hysteresis = hysteresis
        self.min_scale = min_scale
        self.max_scale = max_scale
        # Updated once a step in the cross-replica context: every replica reads the same.
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA

        def variable(value, dtype, name):
            return tf.Variable(value, trainable=False, dtype=dtype, aggregation=aggregation, name=name)

        self.scale = variable(float(initial_scale), tf.float32, "scale")
        self.growth_count = variable(0, tf.int64, "growth_count")  # clean steps since the last change
        self.overflow_streak = variable(0, tf.int64, "overflow_streak")  # overflowing steps in a row
        self.overflows = variable(0, tf.int64, "overflows")  # overflowing steps in all

    def describe(self):
        if not self.dynamic:
            return f"fixed loss scale {self.scale.numpy():g}"
        return (
            f"dynamic loss scale from {self.scale.numpy():g} (x{self.growth_factor:g} after {self.growth_interval} "
            f"clean steps up to {self.max_scale:g}, x{self.backoff_factor:g} after {self.hysteresis} "
            f"overflowing step(s) down to {self.min_scale:g})"
        )

    def update(self, loss_finite, grads_finite):
        """Reacts to one step; returns a bool tensor: overflowed with the scale at its floor."""
        overflow = tf.logical_and(loss_finite, tf.logical_not(grads_finite))
        clean = tf.logical_and(loss_finite, grads_finite)
        one = tf.constant(1, tf.int64)
        self.overflows.assign_add(tf.cast(overflow, tf.int64))
        streak = tf.where(
            overflow, self.overflow_streak + one, tf.where(clean, tf.zeros_like(one), self.overflow_streak)
        )
        self.overflow_streak.assign(streak)
        if not self.dynamic:
            return tf.constant(False)
        scale = self.scale.read_value()
        at_floor = tf.logical_and(overflow, scale <= self.min_scale)
        grow = tf.logical_and(clean, self.growth_count + one >= self.growth_interval)
        back_off = tf.logical_and(overflow, streak >= self.hysteresis)
        grown = tf.maximum(scale, tf.minimum(scale * self.growth_factor, self.max_scale))
        backed_off = tf.maximum(scale * self.backoff_factor, self.min_scale)
        self.scale.assign(tf.where(grow, grown, tf.where(back_off, backed_off, scale)))
        count = tf.where(clean, self.growth_count + one, tf.zeros_like(one))
        self.growth_count.assign(tf.where(grow, tf.zeros_like(one), tf.where(loss_finite, count, self.growth_count)))
        return at_floor
