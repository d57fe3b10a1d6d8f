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

Nothing is trusted unread (`checkpoint_files.py`): a save is read back before it returns,
and a restore uses the newest checkpoint that reads back whole, warning about each damaged
newer one, so a crash during a save or a damaged file costs the steps since the previous
checkpoint, never the run.
"""

import os

import tensorflow as tf

from amptrain.engine.run_folder.checkpoint_files import (
    damage,
    newest_intact,
    readable_state,
    repair_state_file,
    step_prefixes,
)
from amptrain.errors import CheckpointError, NumericsError


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
            model=checkpointed(model),
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
        self.max_to_keep = max_to_keep
        self.restored_path = None  # the checkpoint `restore_latest` last restored
        self.manager = self._manager(directory, max_to_keep)
        self.best_manager = self._manager(os.path.join(directory, "best"), 1)

    def _manager(self, directory, max_to_keep, up_to_step=None):
        """TensorFlow's manager of `directory`. Its state file is first rewritten to list the
        checkpoints on disk with an index (up to `up_to_step`) when it cannot be read, or when
        `up_to_step` is given."""
        if up_to_step is not None or not readable_state(directory):
            listed = [
                p
                for p in reversed(step_prefixes(directory))
                if os.path.exists(p + ".index") and (up_to_step is None or _step_of(p) <= up_to_step)
            ]
            repair_state_file(directory, listed)
        return tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=max_to_keep, checkpoint_name="ckpt")

    def restore_latest(self):
        """Restores the newest intact checkpoint, if any (its path: `restored_path`); returns
        its step (0 when none)."""
        self.restored_path = self.latest_path()
        if self.restored_path is None:
            return 0
        try:
            self.checkpoint.restore(self.restored_path).assert_existing_objects_matched()
        except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            raise CheckpointError(
                f"{self.restored_path}: this run's checkpoint does not fit the model ({first}): the model changed "
                "since the run saved it; train it in another run folder, or start this one afresh (--overwrite)"
            ) from None
        step = int(self.step.numpy())
        if self.directory == self.source:
            # Damaged newer checkpoints leave the state file; the next saves replace their files.
            self.manager = self._manager(self.directory, self.max_to_keep, up_to_step=step)
        return step

    def latest_path(self):
        """The newest intact checkpoint where restores read from (None when there is none)."""
        return newest_intact(self.source)

    def saved_step(self):
        """The step of the newest checkpoint saved in this folder (None before the first)."""
        path = self.manager.latest_checkpoint
        return _step_of(path) if path else None

    def save(self):
        self._check_finite()
        return self._verified(self.manager.save(checkpoint_number=int(self.step.numpy())))

    @staticmethod
    def _verified(path):
        problem = damage(path)
        if problem is not None:
            raise CheckpointError(f"the checkpoint just saved does not read back ({problem}); is the disk full?")
        return path

    def _check_finite(self):
        bad = [v.path for v in self.model.trainable_variables if not tf.reduce_all(tf.math.is_finite(v)).numpy()]
        if bad:
            raise NumericsError(
                f"refusing to checkpoint step {int(self.step.numpy())}: non-finite weights in {', '.join(bad[:5])}; "
                f"the last good checkpoint is {self.manager.latest_checkpoint}"
            )

    def save_best(self):
        return self._verified(self.best_manager.save(checkpoint_number=int(self.step.numpy())))

    def restore_best(self):
        """Restores the best checkpoint (by the dev metric); falls back to the latest."""
        path = best_or_latest(self.source)
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        self.checkpoint.restore(path).expect_partial()
        return path


def best_or_latest(directory):
    """The best checkpoint of a run's `checkpoints` folder if it reads back whole, else (with
    a warning) the newest intact step checkpoint; None when there is no checkpoint at all."""
    import logging

    best_directory = os.path.join(directory, "best")
    try:
        best = newest_intact(best_directory, purpose="the best weights")
    except CheckpointError as error:
        best = None
        logging.getLogger("amptrain").warning(f"{error}; using the newest intact step checkpoint instead")
    return best or newest_intact(directory, purpose="the weights")


def restore_weights(model, directory, learned=()):
    """Restores only the model's weights from a run's checkpoints (for eval and predict): the
    best ones, else the latest. A shape that differs (the model was sized by `learned`, the
    run folder's learned files) is one line naming them."""
    path = best_or_latest(directory)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    restore_model(model, path, os.path.dirname(directory), learned)
    return path


def restore_model(model, path, run_dir, learned=(), check_all=False):
    """The model's weights from checkpoint `path`; a mismatch is a `CheckpointError` naming the
    learned files the model was built from (`learned_files.explain_mismatch`)."""
    from amptrain.engine.run_folder.learned_files import explain_mismatch

    try:
        status = tf.train.Checkpoint(model=checkpointed(model)).restore(path).expect_partial()
        if check_all:
            status.assert_existing_objects_matched()
    except (ValueError, tf.errors.InvalidArgumentError) as error:
        raise explain_mismatch(error, path, run_dir, learned) from None


def checkpointed(model):
    """What a checkpoint holds of `model`: itself, or what it says (`checkpoint_view`: a
    pretrained language model with adapters, its adapters alone)."""
    view = getattr(model, "checkpoint_view", None)
    return view() if callable(view) else model


def _step_of(prefix):
    return int(prefix.rsplit("-", 1)[1])
