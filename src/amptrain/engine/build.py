"""Building a run's training parts in one place: `amptrain fit` and `amptrain bench` both
call this, so the bench times exactly the step training runs.

    seed(config.runtime)
    parts = build_training(model, task.loss, config, strategy, policy, total_steps=450)
    parts.trainer.train(iterator, num_steps=8)
    Checkpoints(..., state=parts.checkpoint_state())

The parts: AdamW (or Adam) with its warm-up schedule and learning-rate factor, the loss
scaler the precision asks for, the weight average (`train.ema_decay`), and the `StepRunner`
with the run's accumulation, clipping and stop conditions.
"""

import dataclasses

from amptrain.engine.averaging import WeightAverage
from amptrain.engine.optimizer import build_optimizer, user_optimizer
from amptrain.engine.step_runner import StepRunner
from amptrain.precision.loss_scale import build_scaler


def seed(runtime):
    """The process-wide settings of a run: the seed of every random generator, and op
    determinism when `runtime.deterministic`."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(runtime.seed)
    if runtime.deterministic:
        tf.config.experimental.enable_op_determinism()


@dataclasses.dataclass
class TrainingParts:
    optimizer: object
    learning_rate_factor: object  # a checkpointed variable the NaN policy's restore lowers; None: the user's optimizer
    loss_scale: object  # precision.loss_scale.LossScaler, or None
    weight_average: object  # engine.averaging.WeightAverage, or None
    trainer: StepRunner

    def checkpoint_state(self):
        """The trackables a checkpoint holds besides the model, the optimizer and the step."""
        state = {"loss_scale": self.loss_scale}
        if self.learning_rate_factor is not None:  # None: the user's optimizer (`amptrain.Trainer`)
            state["learning_rate_factor"] = self.learning_rate_factor
        state.update(self.trainer.counters())
        if self.weight_average is not None:
            state["weight_average"] = self.weight_average.trackable
        return state


def build_training(
    model, loss_fn, config, strategy, policy, total_steps, fuse_step=True, learning_rates=None, optimizer=None
):
    """The optimizer, loss scaler, weight average and `StepRunner` of `config` for `model`,
    built under `strategy`'s scope. `fuse_step=False` keeps the optimizer update out of XLA
    even on one device (the engine's path under several replicas; benchmarks compare them).
    `learning_rates`: model -> (scales by variable, weight-decay predicate), the task's
    `learning_rate_scales` (a pretrained encoder's layer-wise rates); None: one rate.
    `optimizer`: the user's (`optimizer.user_optimizer`), in place of the config's."""
    t = config.train
    yours = optimizer is not None  # then the config's clip_norm does not apply either: its own clipnorm does
    with strategy.scope():
        if yours:
            optimizer, lr_factor = user_optimizer(optimizer, strategy, t), None
        else:
            scales, decays = learning_rates(model) if learning_rates is not None else (None, None)
            optimizer, lr_factor = build_optimizer(t, total_steps, scales, decays)
        optimizer.build(model.trainable_variables)
        scaler = build_scaler(config.precision, policy)
        average = WeightAverage(strategy, model.trainable_variables, t.ema_decay) if t.ema_decay > 0 else None
        trainer = StepRunner(
            strategy,
            model,
            optimizer,
            loss_fn,
            loss_scale=scaler,
            jit_compile=config.runtime.jit_compile,
            fused_kernels=config.runtime.fused_kernels,
            clip_norm=0.0 if yours else t.clip_norm,
            max_consecutive_skips=config.precision.max_consecutive_skips,
            stop_on_nonfinite_loss=t.on_nonfinite != "skip",
            accumulation_steps=t.accumulation_steps,
            weight_average=average,
            fuse_step=fuse_step,
        )
    return TrainingParts(optimizer, lr_factor, scaler, average, trainer)
