"""Adam or AdamW with a linear warm-up and a cosine, linear or constant decay.

    optimizer, lr_factor = build_optimizer(config.train, total_steps=450)

Clipping is not the optimizer's: Keras clips each replica's gradients before its
all-reduce, which is not the global norm; the engine clips the all-reduced gradients.
"""

import keras
import tensorflow as tf
from keras import ops


class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Rises linearly from 0 to `peak` over `warmup_steps`, then decays to 0 at `total_steps`.

    Everything is multiplied by `factor`, a checkpointed variable the NaN policy lowers
    after restoring the last good checkpoint (`train.on_nonfinite = "restore"`)."""

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine"):
        self.factor = tf.Variable(
            1.0, trainable=False, name="learning_rate_factor", aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
        )
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = max(total_steps, warmup_steps + 1)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = self.peak * (step + 1.0) / max(self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 0.0, 1.0)
        if self.decay == "cosine":
            decayed = self.peak * 0.5 * (1.0 + ops.cos(3.141592653589793 * progress))
        elif self.decay == "linear":
            decayed = self.peak * (1.0 - progress)
        else:
            decayed = self.peak + 0.0 * progress
        return ops.where(step < self.warmup_steps, warmup, decayed) * ops.cast(self.factor, "float32")

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
        }


def build_optimizer(train_config, total_steps):
    """Returns (optimizer, the schedule's learning-rate factor variable)."""
    schedule = WarmupDecay(train_config.learning_rate, train_config.warmup_steps, total_steps, train_config.decay)
    if train_config.optimizer == "adamw":
        return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=train_config.weight_decay), schedule.factor
    return keras.optimizers.Adam(learning_rate=schedule), schedule.factor


def current_learning_rate(optimizer):
    return float(ops.convert_to_numpy(optimizer.learning_rate))
