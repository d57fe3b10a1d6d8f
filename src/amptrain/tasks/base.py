"""The Task contract: what `api` and the engine ask of a task, and the one `Split` type.

    task = TASKS[config.task](config, run_dir)
    task.prepare()                                    # read, learn into the run folder, encode
    model, policy, reason = task.create_model(strategy)
    loss_sum, count = task.loss(targets, outputs)     # in the training step, on each replica
    dataset = task.train_dataset(start_step=120)      # endless; resume is a start step
    task.evaluate("dev", model, predict, quick=True)  # between training steps
    task.evaluate("test", model, predict, "runs/x/predictions-test")
    task.predict_texts(["see you at lunch"], model, predict)

A task knows its data, model, loss and scores; it knows no strategy, optimizer or
checkpoint. The engine knows no task: `api` hands it what a task built (`engine.loop.Job`).
Everything a task learns from the training split (vocabulary, labels, counts) is a file in
the run folder, so `eval` and `predict` rebuild the same model from the folder alone.

`predict(dataset) -> [outputs of each batch]` is the engine's teacher-forced pass over the
replicas (`Trainer.predict`); `model` is the same model, for a task that scores otherwise
(translation decodes with its own search over the model's weights).
"""

import abc
import dataclasses

import numpy as np


@dataclasses.dataclass
class Split:
    """One split of a task's data, read and encoded.

    `examples` are the records as read (`readers.Example`, `conll.Sentence`,
    `parallel.Pair`); `encoded` holds the task's per-example arrays by name (for instance
    "token_ids", "label_ids"); `lengths` are pieces per example as the model sees them,
    which the batch plan buckets by; `truncated` counts what was cut to `data.max_length`
    (examples, or words for NER); `boundaries` are the bucket lengths its batches are padded
    to (the training split's for the run's splits, its own for a file given later)."""

    name: str
    path: str
    examples: list
    encoded: dict
    lengths: np.ndarray
    truncated: int = 0
    boundaries: list = None

    def __len__(self):
        return len(self.examples)


class Task(abc.ABC):
    """A task: its data, model, loss, scores and predictions. Subclasses set the three
    class attributes and implement the abstract methods (`text.TextTask` implements the
    batching that every text task shares)."""

    primary_metric = None  # the `evaluate` key that picks the best checkpoint (higher is better)
    predictions_suffix = ".jsonl"  # of `predictions-test`, which the final evaluation writes
    keeps_blank_lines = False  # `predict --input`: blank lines are skipped (translation keeps them)

    def __init__(self, config, run_dir):
        self.config = config
        self.run_dir = run_dir
        self.splits = {}  # name -> Split, filled by `prepare` and `add_split`

    # === Data ===

    @abc.abstractmethod
    def prepare(self, split_names=("train", "dev", "test")):
        """Reads the named splits the config has, learns what the task needs from the
        training split (or reloads it from the run folder), and encodes them into
        `self.splits`. A bad file raises `DataError` naming its path and line, before any
        slow work."""

    @abc.abstractmethod
    def add_split(self, name, path):
        """Reads and encodes another labelled file as split `name` (`amptrain eval --data`)."""

    @abc.abstractmethod
    def signature(self):
        """The `tf.TensorSpec`s of a batch: (features, targets, token_counts), where
        `token_counts` is (batch, 2): each row's real and padded tokens."""

    @property
    @abc.abstractmethod
    def steps_per_epoch(self):
        """Batches in one pass over the training split."""

    @abc.abstractmethod
    def train_dataset(self, start_step):
        """The endless `tf.data.Dataset` of training batches from batch `start_step` on: batch
        N is a pure function of (seed, N), so resuming is starting at the checkpoint's step."""

    @abc.abstractmethod
    def train_buckets(self):
        """[(padded length, rows)] of the training batches, one a bucket: the batch-split
        check (`distribute.check_split`) needs every bucket's rows to split over the replicas."""

    # === Model and loss ===

    @abc.abstractmethod
    def build_model(self, dtype):
        """The Keras model, every layer given `dtype` (a policy name); float32 islands say why."""

    def create_model(self, strategy=None, policy=None):
        """(model, policy, why): the config's precision policy chosen (or `policy`, the
        precision probe's candidate) and the model built under `strategy`'s scope (its
        variables are then the strategy's)."""
        import contextlib

        from amptrain.precision.policy import select_policy

        policy, reason = select_policy(policy or self.config.precision.policy)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model = self.build_model(policy)
        return model, policy, reason

    @abc.abstractmethod
    def loss(self, targets, outputs):
        """(sum of the per-target losses, number of real targets) of one replica's batch, both
        float32. The engine all-reduces both and divides, so the update is the same for any
        replica count, padding rows or token-level targets."""

    # === Evaluation and prediction ===

    @abc.abstractmethod
    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        """{metric: value} of split `split_name`, `primary_metric` among them. With
        `predictions_path`, the predictions are written to it + `predictions_suffix`.
        `quick`: an evaluation between training steps, which may score a cheaper way
        (translation decodes the first `decode.dev_sentences` greedily)."""

    @abc.abstractmethod
    def predict_texts(self, texts, model, predict):
        """One JSON-ready record a raw text (`amptrain predict`)."""
