"""Adam or AdamW with a linear warm-up and a cosine, linear or constant decay.

    optimizer, lr_factor = build_optimizer(config.train, total_steps=450)

Clipping is not the optimizer's: Keras clips each replica's gradients before its
all-reduce, which is not the global norm; the engine clips the all-reduced gradients.

Keras's Adam, as written, is about 40 graph ops a variable (the bias corrections computed
again for each variable, its decay computing the schedule again for each), which a step
traces, optimizes and dispatches: 1,219 of the 2,759 ops of a tiny classifier's training
call. `OneKernelAdam` makes each variable's update TensorFlow's fused Adam kernel
(`ResourceApplyAdam`: the same formula, the epsilon-hat form Keras uses) with its decay
before it, and computes the bias corrections and the rate once a step.
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


class OneKernelAdam:
    """Adam's update as one `ResourceApplyAdam` a variable, the decoupled weight decay (when
    the optimizer has one) just before it, as Keras's AdamW orders them; a mixin before a
    Keras Adam class, which keeps its variables (checkpoints are unchanged), its
    configuration and its `apply`. `_rate_and_decay` says what each variable gets.

    Keras computes `1 - beta_1` in Python float64 and ResourceApplyAdam in float32, so the
    weights differ from Keras's in the last bits; a non-float32 variable or a sparse
    gradient takes Keras's own update."""

    def _apply_weight_decay(self, variables):
        pass  # in `_backend_update_step`, with the step's rate computed once

    def _rate_and_decay(self, index, learning_rate):
        """(this variable's learning rate, its decay factor or None)."""
        decays = self.weight_decay and self._use_weight_decay(self._trainable_variables[index])
        return learning_rate, (self.weight_decay if decays else None)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # As Keras's TensorFlow optimizer does it: a replica context sums first, and the
        # update runs once a variable's copy, each on its device.
        trainable_variables = [v.value if isinstance(v, keras.Variable) else v for v in trainable_variables]
        grads_and_vars = self._all_reduce_sum_gradients(list(zip(grads, trainable_variables)))
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._update_all, self._distribution_strategy, grads_and_vars, learning_rate
        )

    def _update_all(self, distribution, grads_and_vars, learning_rate):
        step = tf.cast(self.iterations + 1, tf.float32)
        beta1, beta2 = tf.constant(self.beta_1, tf.float32), tf.constant(self.beta_2, tf.float32)
        # Once a step, for every variable: ResourceApplyAdam's scalars but the rate.
        constants = {
            "beta1_power": tf.pow(beta1, step),
            "beta2_power": tf.pow(beta2, step),
            "beta1": beta1,
            "beta2": beta2,
            "epsilon": tf.constant(self.epsilon, tf.float32),
        }
        learning_rate = tf.cast(learning_rate, tf.float32)
        for gradient, variable in grads_and_vars:
            distribution.extended.update(
                variable, self._update_one, args=(gradient, learning_rate, constants), group=False
            )

    def _update_one(self, variable, gradient, learning_rate, constants):
        index = self._get_variable_index(variable)
        rate, decay = self._rate_and_decay(index, tf.cast(learning_rate, variable.dtype))
        if decay is not None:
            variable.assign_sub(variable * decay * rate)
        if variable.dtype != tf.float32 or self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return self.update_step(gradient, variable, rate)
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            lr=rate,
            grad=tf.cast(gradient, tf.float32),
            **constants,
        )


class Adam(OneKernelAdam, keras.optimizers.Adam):
    pass


class AdamW(OneKernelAdam, keras.optimizers.AdamW):
    pass


class ScaledAdamW(OneKernelAdam, keras.optimizers.Adam):
    """AdamW whose learning rate, and so its decoupled weight decay, is scaled per variable
    (the fine-tuning recipe: a head's own rate, layer-wise decay), with no decay on the
    variables `decays` refuses (biases and layer norms). Scaling the gradients instead
    would do nothing: Adam's step does not depend on the gradient's scale."""

    def __init__(self, scales, decays, weight_decay, **kwargs):
        super().__init__(**kwargs)
        self._scale_of = scales  # {id(variable): factor}
        self._decays_fn = decays
        self.decoupled_weight_decay = weight_decay

    def build(self, var_list):
        super().build(var_list)
        self._scales = [float(self._scale_of.get(id(v), 1.0)) for v in var_list]
        self._decayed = [self.decoupled_weight_decay > 0 and self._decays_fn(v) for v in var_list]

    def _rate_and_decay(self, index, learning_rate):
        decay = self.decoupled_weight_decay if self._decayed[index] else None
        return learning_rate * self._scales[index], decay


def build_optimizer(train_config, total_steps, scales=None, decays=None):
    """Returns (optimizer, the schedule's learning-rate factor variable). `scales`
    ({id(variable): factor}, see `models.pretrained.learning_rate_scales`) and `decays`
    (variable -> bool): a `ScaledAdamW` (Adam with `train.optimizer = "adam"`: no decay)."""
    schedule = WarmupDecay(train_config.learning_rate, train_config.warmup_steps, total_steps, train_config.decay)
    if scales is not None:
        decay = train_config.weight_decay if train_config.optimizer == "adamw" else 0.0
        return ScaledAdamW(scales, decays, decay, learning_rate=schedule), schedule.factor
    if train_config.optimizer == "adamw":
        return AdamW(learning_rate=schedule, weight_decay=train_config.weight_decay), schedule.factor
    return Adam(learning_rate=schedule), schedule.factor


def current_learning_rate(optimizer):
    return float(ops.convert_to_numpy(optimizer.learning_rate))


def user_optimizer(given, strategy, train_config):
    """The optimizer of `amptrain.Trainer(optimizer=...)`, checked and ready to build under
    `strategy`'s scope: a Keras optimizer, its name, a function that makes one (called here,
    under the scope), or a learning-rate schedule for the config's optimizer. Its slots follow the
    variables, float32 under every policy; the engine scales the loss itself."""
    from amptrain.distribute import is_single_device
    from amptrain.errors import UserError

    if isinstance(given, keras.optimizers.schedules.LearningRateSchedule):
        if train_config.optimizer == "adamw":
            return AdamW(learning_rate=given, weight_decay=train_config.weight_decay)
        return Adam(learning_rate=given)
    if isinstance(given, str):  # as compile(optimizer="adamw") takes it
        try:
            given = keras.optimizers.get(given)
        except ValueError:
            raise UserError(f"optimizer: Keras knows no optimizer {given!r}") from None
    elif callable(given) and not isinstance(given, keras.optimizers.Optimizer):
        given = given()
    if isinstance(given, keras.optimizers.LossScaleOptimizer):
        raise UserError(
            "optimizer: a LossScaleOptimizer; pass the optimizer inside it (amptrain scales the loss itself, "
            "as precision.loss_scale says)"
        )
    if not isinstance(given, keras.optimizers.Optimizer):
        raise UserError(
            "optimizer: expected a keras.optimizers.Optimizer, its name, a function that makes one, or a learning-rate "
            f"schedule, received {given!r}"
        )
    if given.built:
        raise UserError(
            f"optimizer: this {type(given).__name__} is already built for other variables; pass a fresh one, "
            "or a function that makes one"
        )
    made_under = getattr(given, "_distribution_strategy", None)
    if made_under is not None and made_under is not strategy and not is_single_device(strategy):
        raise UserError(
            f"optimizer: made outside the {type(strategy).__name__}'s scope, so its updates would not reach every "
            f"replica; pass a function that makes it (optimizer=lambda: keras.optimizers.{type(given).__name__}(...)) "
            "and amptrain calls it under the scope"
        )
    return given
