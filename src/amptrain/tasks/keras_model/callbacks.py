"""Keras callbacks on amptrain's fit loop (`amptrain.Trainer(callbacks=[...])`).

    callbacks = KerasCallbacks(check_callbacks([EarlyStopping(monitor="val_loss")], optimizer=None))
    # the engine's loop then calls (`engine/loop.py`, Job.callbacks):
    callbacks.train_begin(model, optimizer, epochs=5, steps_per_epoch=40); callbacks.epoch_begin(0)
    callbacks.batch_end(7, {"loss": 0.41}); stop = callbacks.epoch_end(0, {"loss": ..., "val_loss": ...})

An epoch is an evaluation interval (`train.eval_every`, by default an epoch of the data), as
it is an epoch of `model.fit`: `on_epoch_end` gets the dev scores under Keras's names
(`val_loss`, `val_accuracy`) and the interval's mean training loss (`loss`);
`on_train_batch_end` comes once a graph call of `steps_per_execution` steps, as under Keras.
The callbacks see the model with the run's optimizer as `model.optimizer` (so
`LearningRateScheduler` sets its rate) and a `stop_training` flag that ends the run after
that evaluation's checkpoint.
"""

from amptrain.errors import UserError

# Callbacks that would fight the engine for what it does already.
REFUSED = {
    "ModelCheckpoint": "amptrain checkpoints into run_dir/checkpoints every train.checkpoint_every steps and keeps "
    "the best by `monitor`",
    "BackupAndRestore": "amptrain resumes a run from its last checkpoint: run the same fit again",
    "TensorBoard": "amptrain writes TensorBoard events into run_dir/tensorboard (train.histogram_every for "
    "histograms, runtime.profile_steps for the profiler)",
    "ProgbarLogger": "amptrain prints its own progress",
}
# Callbacks that set the optimizer's rate: a number they can set, not the config's schedule.
SET_THE_RATE = ("LearningRateScheduler", "ReduceLROnPlateau")


def check_callbacks(callbacks, optimizer):
    """The callbacks as a list, or a one-line refusal of one amptrain cannot honour."""
    import keras

    # The rate the updates use (a LossScaleOptimizer's own is a placeholder 0: its inner one's);
    # None without an optimizer; a schedule is not checked.
    rate = getattr(getattr(optimizer, "inner_optimizer", optimizer), "_learning_rate", None)
    if isinstance(rate, (float, int)) or (hasattr(rate, "numpy") and rate.shape == ()):
        if not 0 < float(rate) < float("inf"):  # NaN weights otherwise, diagnosed as an overflow of the data
            raise UserError(f"optimizer: learning_rate {float(rate)}; expected a finite number > 0")
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]  # one callback for a list of one, as a user means it
    try:
        callbacks = list(callbacks or ())
    except TypeError:
        raise UserError(
            f"callbacks: expected a list of keras.callbacks.Callback objects, received {callbacks!r}"
        ) from None
    for callback in callbacks:
        name = type(callback).__name__
        if not isinstance(callback, keras.callbacks.Callback):
            raise UserError(f"callbacks: expected keras.callbacks.Callback objects, received {callback!r}")
        for refused, instead in REFUSED.items():
            if isinstance(callback, getattr(keras.callbacks, refused)):
                raise UserError(f"callbacks: {name} is not taken: {instead}")
        if name in SET_THE_RATE and optimizer is None:
            raise UserError(
                f"callbacks: {name} sets the optimizer's learning rate, and the config's follows a schedule; pass "
                "optimizer=keras.optimizers.AdamW(learning_rate=1e-3) (a number it can set), as model.fit needs"
            )
    return callbacks


class KerasCallbacks:
    def __init__(self, callbacks):
        self.callbacks = callbacks
        self.model = self.list = None

    def train_begin(self, model, optimizer, epochs, steps_per_epoch):
        import keras

        self.model = _SeenModel(model, optimizer)
        params = {"epochs": epochs, "steps": steps_per_epoch, "verbose": 0}
        self.list = keras.callbacks.CallbackList(self.callbacks, model=self.model, **params)
        self.list.on_train_begin()

    def epoch_begin(self, epoch):
        self.list.on_epoch_begin(epoch)

    def batch_end(self, batch, logs):
        self.list.on_train_batch_end(batch, dict(logs))

    def epoch_end(self, epoch, logs):
        """True when a callback set `model.stop_training`."""
        self.list.on_epoch_end(epoch, dict(logs))
        return bool(self.model.stop_training)

    def train_end(self, logs):
        self.list.on_train_end(dict(logs))


class _SeenModel:
    """The model as the callbacks see it: the user's Keras model, with the run's optimizer
    and a `stop_training` flag of its own (the model itself is not compiled)."""

    def __init__(self, model, optimizer):
        self.__dict__.update(_model=model, optimizer=optimizer, stop_training=False)

    def __getattr__(self, name):
        return getattr(self._model, name)
