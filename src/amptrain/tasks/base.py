"""The Task contract: what `api` and the engine ask of a task, and the one `Split` type.

    task = TASKS[config.task](config, run_dir)
    task.prepare()                                    # read, learn into the run folder, encode
    model, policy, reason = task.create_model(strategy)
    loss_sum, count = task.loss(targets, outputs)     # in the training step, on each replica
    dataset = task.train_dataset(start_step=120)      # endless; resume is a start step
    task.evaluate("dev", model, predict, quick=True)  # between training steps
    task.evaluate("test", model, predict, "runs/x/predictions-test")
    task.predict_texts(["see you at lunch"], model, predict)
    dataset, shape = task.probe_batches()             # the batch the precision probe times

A task knows its data, model, loss and scores; it knows no strategy, optimizer or
checkpoint. The engine knows no task: `api` hands it what a task built (`engine.job.Job`).
Everything a task learns from the training split (vocabulary, labels, counts) is a file in
the run folder, so `eval` and `predict` rebuild the same model from the folder alone.

`predict(dataset) -> [outputs of each batch]` is the engine's teacher-forced pass over the
replicas (`Trainer.predict`); `model` is the same model, for a task that scores otherwise
(translation decodes with its own search over the model's weights).
"""

import abc
import dataclasses
import functools

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
    """A task: its data, model, loss, scores and predictions, and every extension point that
    is its own (its file formats, config section and checks, serving module, its variables'
    learning-rate scales). Subclasses set the class
    attributes and implement the abstract methods (`text.TextTask` implements the batching
    that every text task shares). A config names a task by its registry name
    (amptrain/registry.py) or by import path: `task = "mytasks:SentencePairs"`."""

    primary_metric = None  # the `evaluate` key that picks the best checkpoint
    higher_is_better = True  # of primary_metric
    predictions_suffix = ".jsonl"  # of `predictions-test`, which the final evaluation writes
    keeps_blank_lines = False  # `predict --input`: blank lines are skipped (translation keeps them)
    # The record key `amptrain predict` prints alone, a line a record (translation's text, a
    # language model's continuation); None: each record as one JSON line (and with --json)
    printed_field = None
    formats = ("auto",)  # the `data.format` values it reads ("auto": from the file's extension)
    # Its own config: {name: frozen dataclass}, read as config.NAME: a section of its own
    # (translation's "decode"), or its keys of a shared section as a subclass of that
    # section's dataclass (translation's "data": `config.sections.DataConfig` and the target files)
    config_sections = {}
    untrained_sections = ()  # of those, the ones a resumed run may change (how it decodes, say)
    # The kind of pretrained folder `model.pretrained` may name for it: "encoder" (BERT, ...),
    # "causal" (GPT-2, Llama, ...), or None: none (config/families.py says which family is which).
    pretrained_kind = None
    reads_files = True  # its data is data.train (and dev, test); a user's model's comes as datasets
    reads_corpora = False  # data.train (dev, test) may each be a file, a folder or a glob of files
    optimizer = None  # the user's optimizer (`amptrain.Trainer`), in place of the config's
    callbacks = None  # told of the run as Keras callbacks are (`engine.job.Job.callbacks`)
    projector_layer = None  # a user's model: the name of its token embedding (`amptrain.Trainer`)
    # Its serving module: a `serving.modules.ServingModule` subclass taking (task, model), from
    # the task's own package, which `amptrain export` builds; None: the task does not export.
    serving_module = None
    # `amptrain export --format F` beside the SavedModel and ONNX: the folder formats it writes
    # itself with `write_export` (a language model on a pretrained folder: "transformers", "gguf")
    export_formats = ()

    def with_config(self, config):
        """A copy of this prepared task under `config`, which may differ in how it trains
        (`precision`, `runtime`: the probe's decision) but not in what it reads: the splits
        and what was learned are shared, the task itself is left as it was."""
        import copy

        if config.data != self.config.data or config.model != self.config.model:
            raise ValueError("with_config: the data and model sections must stay the same")
        task = copy.copy(self)
        task.config = config
        return task

    @classmethod
    def check_config(cls, config):
        """Refuses what this task cannot do with the config (`config.require`: the key, what was
        expected, what was received); called when a config naming the task is loaded."""
        from amptrain.config import require

        d = config.data
        name = config.task
        if cls.reads_files:
            require(bool(d.train), "data.train", "the path of a training file", d.train)
        require(d.format in cls.formats, "data.format", f"one of {cls.formats} for task {name!r}", d.format)
        require(
            not config.model.pretrained or cls.pretrained_kind,
            "model.pretrained",
            f"nothing for task {name!r} (it builds no pretrained model)",
            config.model.pretrained,
        )
        if config.model.pretrained:
            check_pretrained_kind(config.model.pretrained, cls.pretrained_kind, name)

    def __init__(self, config, run_dir):
        self.config = config
        self.run_dir = run_dir
        self.splits = {}  # name -> Split, filled by `prepare` and `add_split`

    @functools.cached_property
    def checkpoint(self):
        """The pretrained folder's checkpoint (`model.pretrained`: config/pretrained.py), or None."""
        from amptrain.config.pretrained import read_checkpoint

        path = self.config.model.pretrained
        return read_checkpoint(path) if path else None

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
    def train_dataset(self, start_step, share=None):
        """The endless `tf.data.Dataset` of training batches from batch `start_step` on: batch
        N is a pure function of (seed, N), so resuming is starting at the checkpoint's step.
        `share=(part, parts)`: only that part of each batch's rows, in order (a worker's:
        `data.pipeline.plan_dataset` does it for a batch plan)."""

    def probe_batches(self):
        """(endless `tf.data.Dataset` repeating one real training batch, its shape): what
        the precision probe times a candidate on (`autoprecision/trials.py`), the batch shape
        most of a run's time goes to. A task without it cannot use `precision.policy = "auto"`
        with more than one candidate."""
        raise NotImplementedError(
            f"{type(self).__name__}.probe_batches: not implemented; name precision.policy and runtime.jit_compile"
        )

    def probe_identity(self):
        """What the probe's cache key must add to the config to name this task's model (the
        config's `[model]` and `[data]` describe a built-in task's; None: nothing)."""
        return None

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

    def projections(self, model):
        """[(name, embedding table, pieces in id order, counts or None)]: the token embeddings
        TensorBoard's projector shows, written with each best checkpoint (`engine/projector.py`);
        none by default."""
        return []

    def data_figures(self):
        """{split: {figure: number}} the run record keeps under `data` (what packing made of a
        chat split: pieces scored, seen, padding); None: nothing beyond the log."""
        return None

    def learning_rate_scales(self, model):
        """{id(variable): factor} of the learning rate by variable (a pretrained encoder's
        layer-wise decay), or None for one rate everywhere; and the predicate of the variables
        that get weight decay (None: all). The engine builds the optimizer with them."""
        return None, None

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

    def evaluation_memory(self, model):
        """{part: bytes} an evaluation holds beside the model and the runtime, where that can
        pass a training step's (a language model's generated replies); none by default."""
        return {}

    def warm_up_evaluation(self, model):
        """Runs once, at the smallest size, what such an evaluation makes functions for, so that
        a memory estimate measures the runtime they keep (a language model's generation);
        returns whether there was anything to run."""
        return False

    def write_export(self, fmt, model, path, precision="float32", quantize=None):
        """Writes `model` (built in float32, a checkpoint's weights) in one of `export_formats`
        into the folder `path`, its weights in `precision` (or quantized: `quantize`, a format's
        own names); returns what the export's record says."""
        raise NotImplementedError(fmt)

    @abc.abstractmethod
    def predict_texts(self, texts, model, predict):
        """One JSON-ready record a raw text (`amptrain predict`)."""


def check_pretrained_kind(path, kind, task_name):
    """Refuses a folder of another kind than the task builds on (a GPT-2 for a classifier), in
    one line naming the families it takes."""
    from amptrain.config.families import FOLDER_RULES
    from amptrain.config.pretrained import read_checkpoint
    from amptrain.errors import ConfigError

    checkpoint = read_checkpoint(path)
    if checkpoint.kind != kind:
        takes = ", ".join(t for t, rules in FOLDER_RULES.items() if rules.kind == kind)
        raise ConfigError(
            f"model.pretrained: {path} is a {checkpoint.model_type} ({checkpoint.kind}) folder; "
            f"task {task_name!r} builds on a {kind} one: {takes}"
        )


PRETRAINED_FILE = "pretrained.json"  # the checkpoint's path and weights hash (model.pretrained)


def record_pretrained(checkpoint, run_dir):
    """Records the checkpoint's path and weights hash in the run folder; a run folder that
    recorded other weights is refused (its checkpoints were trained from them). Returns the hash."""
    import json
    import os

    from amptrain.config.pretrained import weights_hash
    from amptrain.errors import ConfigError

    record = {"path": checkpoint.path, "weights_sha256": weights_hash(checkpoint)}
    path = os.path.join(run_dir, PRETRAINED_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        if saved["weights_sha256"] != record["weights_sha256"]:
            raise ConfigError(
                f"{checkpoint.weights_path}: other weights than the run was trained from "
                f"({saved['path']}, sha256 {saved['weights_sha256'][:12]}…, recorded in {path}); "
                "pass --overwrite or --run-dir to train from these"
            )
        return record["weights_sha256"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return record["weights_sha256"]
