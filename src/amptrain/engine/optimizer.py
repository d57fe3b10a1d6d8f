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


class ScaledAdamW(keras.optimizers.Adam):
    """AdamW whose learning rate, and so its decoupled weight decay, is scaled per variable
    (the fine-tuning recipe: a head's own rate, layer-wise decay), with no decay on the
    variables `decays` refuses (biases and layer norms).

    Keras' AdamW decays every variable by the one global rate (`_apply_weight_decay`), so
    the decay is applied here, in each variable's update, before Adam's step: the order
    AdamW applies them in. Scaling the gradients instead would do nothing: Adam's step does
    not depend on the gradient's scale."""

    def __init__(self, scales, decays, weight_decay, **kwargs):
        super().__init__(**kwargs)
        self._scale_of = scales  # {id(variable): factor}
        self._decays_fn = decays
        self.decoupled_weight_decay = weight_decay

    def build(self, var_list):
        super().build(var_list)
        self._scales = [float(self._scale_of.get(id(v), 1.0)) for v in var_list]
        self._decayed = [self.decoupled_weight_decay > 0 and self._decays_fn(v) for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        learning_rate = ops.cast(learning_rate, variable.dtype) * self._scales[index]
        if self._decayed[index]:
            variable.assign_sub(variable * (learning_rate * self.decoupled_weight_decay))
        super().update_step(gradient, variable, learning_rate)


def build_optimizer(train_config, total_steps, scales=None, decays=None):
    """Returns (optimizer, the schedule's learning-rate factor variable). `scales`
    ({id(variable): factor}, see `models.pretrained.learning_rate_scales`) and `decays`
    (variable -> bool): a `ScaledAdamW` (Adam with `train.optimizer = "adam"`: no decay)."""
    schedule = WarmupDecay(train_config.learning_rate, train_config.warmup_steps, total_steps, train_config.decay)
    if scales is not None:
        decay = train_config.weight_decay if train_config.optimizer == "adamw" else 0.0
        return ScaledAdamW(scales, decays, decay, learning_rate=schedule), schedule.factor
    if train_config.optimizer == "adamw":
        return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=train_config.weight_decay), schedule.factor
    return keras.optimizers.Adam(learning_rate=schedule), schedule.factor


def current_learning_rate(optimizer):
    return float(ops.convert_to_numpy(optimizer.learning_rate))
