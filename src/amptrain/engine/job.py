"""What a task gives the engine: a `Job` (`engine/loop.py` runs it).

job = Job(model, task.loss, task.train_dataset, task.steps_per_epoch, task.evaluate, "accuracy")
"""

import dataclasses
import inspect
import logging
from collections.abc import Callable

import keras

from amptrain.engine.run_log import EVERY_WORKER, LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


@dataclasses.dataclass
class Job:
    """What a task gives the engine."""

    model: keras.Model
    # (targets, outputs) -> (sum of per-target losses, number of real targets), float32
    loss_fn: Callable
    # start_step -> endless tf.data.Dataset of (features, targets, token_counts) from that step on
    train_dataset: Callable
    steps_per_epoch: int
    # (split, model, predict, predictions_path=None, quick=False) -> {metric: value};
    # predict(dataset) -> outputs of each batch. `quick`: between training steps.
    evaluate: Callable
    primary_metric: str  # the `evaluate` key that picks the best checkpoint
    has_dev: bool = True
    has_test: bool = True
    # model -> (learning-rate scales by variable, weight-decay predicate): the task's
    # `learning_rate_scales`; None: one rate for every variable
    learning_rates: Callable = None
    higher_is_better: bool = True  # of primary_metric (a loss is lower-is-better)
    # The model's training parts when already built (`engine.build.TrainingParts`: the
    # precision probe's winner, `autoprecision/decision.py`), else built here.
    parts: object = None
    # The user's optimizer (`engine.optimizer.user_optimizer`) in place of the config's.
    optimizer: object = None
    # Told of the run as Keras callbacks are (`tasks/keras_model/callbacks.py`):
    # train_begin(model, optimizer, epochs, steps_per_epoch), epoch_begin(epoch),
    # batch_end(batch, logs), epoch_end(epoch, logs) -> stop?, train_end(logs); an epoch
    # is an evaluation interval. With it, an `epoch` record a
    # dev evaluation (its logs as Keras names them), from which a run's history is read.
    callbacks: object = None
    # model -> [engine.projector.Projection]: the token embeddings for TensorBoard's
    # projector, written with each best checkpoint (`Task.projections`)
    projections: Callable = None
    # {split: figures} of what the task read (`Task.data_figures`: a chat split's pieces
    # scored, seen and padding), the run record's `data`; None: nothing to say
    data_figures: dict = None

    @property
    def builds_shares(self):
        """Whether the task builds a worker's part of each batch (`Task.train_dataset(step,
        share)`); a user's task written before takes the whole batch, and each worker keeps
        its slices of it (`distribute/batches.py`)."""
        return "share" in inspect.signature(self.train_dataset).parameters

    def input_share(self, cluster):
        """[this worker, workers] when each worker builds only its part of every global
        batch's rows (said on every worker's console), else None."""
        if not cluster.is_multi_worker or not self.builds_shares:
            return None
        logger.info(
            f"{cluster.name()}: builds part {cluster.index + 1} of {cluster.num_workers} of each global batch's rows",
            extra=EVERY_WORKER,
        )
        return [cluster.index, cluster.num_workers]
