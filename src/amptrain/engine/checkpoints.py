"""Step-keyed checkpoints of everything a resume needs, and the best one kept apart.

    checkpoints = Checkpoints("runs/x/checkpoints", model, optimizer, trainer.step,
                              state={"loss_scale": scaler, **trainer.counters()}, max_to_keep=3)
    step = checkpoints.restore_latest()   # 0 when there is none
    checkpoints.save()                    # keyed by the step variable's value
    checkpoints.save_best()

The data position needs no saving: the batch plan is a function of (seed, step).
The best-so-far metric and the early-stopping count live in variables here so that
they are restored together with the weights they describe.

A checkpoint is the last good state a NaN policy goes back to, so `save` refuses
weights that are not all finite (the engine never applies a non-finite step; this is
the guard that keeps a bug elsewhere from poisoning the checkpoints).
"""

import os

import tensorflow as tf

from amptrain.errors import NumericsError


class Checkpoints:
    def __init__(self, directory, model, optimizer, step, state=None, max_to_keep=3, source=None):
        self.directory = directory
        # Where restores read from: the chief's folder, for a worker that saves elsewhere.
        self.source = source or directory
        self.model = model
        self.step = step
        # The lowest finite float64, not -inf: check-numerics mode stops on any read of an inf.
        self.best_metric = tf.Variable(tf.float64.min, dtype=tf.float64, trainable=False, name="best_metric")
        self.best_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="best_step")
        self.evals_since_best = tf.Variable(0, dtype=tf.int64, trainable=False, name="evals_since_best")
        tracked = dict(
            model=model,
            # Keras's dropout seed states are model variables that tf.train.Checkpoint
            # does not reach through the model; without them a resumed run draws
            # different dropout masks than an uninterrupted one.
            seed_states=[v for v in model.variables if "seed_generator_state" in v.path],
            optimizer=optimizer,
            step=self.step,
            best_metric=self.best_metric,
            best_step=self.best_step,
            evals_since_best=self.evals_since_best,
        )
        for name, trackable in (state or {}).items():
            if trackable is not None and name not in tracked:
                tracked[name] = trackable
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, directory, max_to_keep=max_to_keep, checkpoint_name="ckpt"
        )
        self.best_manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(directory, "best"), max_to_keep=1, checkpoint_name="ckpt"
        )

    def restore_latest(self):
        """Restores the newest checkpoint, if any; returns its step (0 when none)."""
        path = self.latest_path()
        if path is None:
            return 0
        self.checkpoint.restore(path).assert_existing_objects_matched()
        return int(self.step.numpy())

    def latest_path(self):
        """The newest checkpoint where restores read from (None when there is none)."""
        return tf.train.latest_checkpoint(self.source)

    def save(self):
        self._check_finite()
        return self.manager.save(checkpoint_number=int(self.step.numpy()))

    def _check_finite(self):
        bad = [v.path for v in self.model.trainable_variables if not tf.reduce_all(tf.math.is_finite(v)).numpy()]
        if bad:
            raise NumericsError(
                f"refusing to checkpoint step {int(self.step.numpy())}: non-finite weights in {', '.join(bad[:5])}; "
                f"the last good checkpoint is {self.manager.latest_checkpoint}"
            )

    def save_best(self):
        return self.best_manager.save(checkpoint_number=int(self.step.numpy()))

    def restore_best(self):
        """Restores the best checkpoint (by the dev metric); falls back to the latest."""
        path = tf.train.latest_checkpoint(os.path.join(self.source, "best")) or self.latest_path()
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        self.checkpoint.restore(path).expect_partial()
        return path


def restore_weights(model, directory, which="best"):
    """Restores only the model's weights from a run's checkpoints (for eval and predict)."""
    best = tf.train.latest_checkpoint(os.path.join(directory, "best"))
    path = (best if which == "best" else None) or tf.train.latest_checkpoint(directory)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return path
