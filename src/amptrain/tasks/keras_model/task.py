"""A task made of the user's pieces: their Keras model (or its builder), loss, metrics and
datasets. `amptrain.Trainer` builds one, so a user's model takes the engine's path as the
built-in tasks do (loss scaling, telemetry, XLA modes, distribution, exact resume, export).

    pieces = UserPieces(model=build, loss=loss_fn, metrics=[("accuracy", None)],
                        sources={"train": SplitSource.of(train_ds, "train")}, monitor="accuracy")
    task = KerasModelTask(config, run_dir, pieces)

A run folder of such a task is read back from Python (`amptrain.Trainer`), which holds the
model's builder; the CLI cannot rebuild a model it has no code for, and says so.
"""

import dataclasses
import json
import os
import re

import numpy as np

from amptrain.errors import UserError, id_out_of_range
from amptrain.tasks.base import Task
from amptrain.tasks.keras_model.scoring import check_loss, pick_accuracy
from amptrain.tasks.keras_model.serving import KerasModelModule

DATA_FILE = "data.json"  # the training data's first batches' hash: a resume on other data is refused


@dataclasses.dataclass
class UserPieces:
    model: object  # policy name -> keras.Model, or a built keras.Model
    loss: object  # the engine's (targets, outputs) -> (sum, count), `keras_scoring.as_loss`
    metrics: list  # [(name, make)], `keras_scoring.as_metrics`
    sources: dict  # split name -> `keras_data.SplitSource`
    monitor: str = "loss"
    higher_is_better: bool = False
    optimizer: object = None  # the user's (`engine.optimizer.user_optimizer`); None: the config's
    callbacks: object = None  # `callbacks.KerasCallbacks`, or None
    projector_layer: str = None  # the name of the model's token embedding, for TensorBoard's projector
    projector_pieces: list = None  # its rows' pieces (None: their ids)


class KerasModelTask(Task):
    primary_metric = "loss"  # the Trainer's `monitor` replaces it for its run
    higher_is_better = False
    predictions_suffix = ".npy"  # the test split's outputs, in order (padding rows left out)
    reads_files = False  # its data comes as datasets or arrays, not data.train
    serving_module = KerasModelModule

    def __init__(self, config, run_dir, pieces=None):
        if pieces is None:
            raise UserError(
                f"{run_dir}: a run of your own Keras model is read back from Python: amptrain.Trainer(model=..., "
                "run_dir=...) then .evaluate(), .predict() or .export(); the command line has no code to build it"
            )
        super().__init__(config, run_dir)
        self.pieces = pieces
        self.optimizer, self.callbacks = pieces.optimizer, pieces.callbacks
        self.primary_metric = pieces.monitor
        self.higher_is_better = pieces.higher_is_better
        self.labels = None
        self.rows = None  # every batch's rows: the first training batch's
        self._steps_per_epoch = None
        self._materialized = {}  # split -> its batches as NumPy (dev and test are scored from these)

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        import keras

        # A seeded tf.data op draws from (the global seed, its own): set the run's global seed
        # first, so that the hash sees the batches training will (the engine sets it again).
        keras.utils.set_random_seed(self.config.runtime.seed)
        sources = self.pieces.sources
        if "train" in sources:
            self.rows = sources["train"].rows()
            self._steps_per_epoch = sources["train"].count()
            self._check_data(sources["train"].fingerprint(self.rows))
        else:
            self.rows = next(iter(sources.values())).rows()
        for name in split_names:
            if name in sources:
                self.splits[name] = sources[name]

    def _check_data(self, fingerprint):
        """Records the hash of the training data's first batches; a resume whose data hash
        differs is refused (it would train on other batches than those it resumes from)."""
        path = os.path.join(self.run_dir, DATA_FILE)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)["train_fingerprint"]
            if saved != fingerprint:
                raise UserError(
                    f"{path}: the training data's first batches differ from those this run was trained on, so a "
                    "resume cannot be exact; an unseeded shuffle (use shuffle(..., seed=N)) or changed data? Pass "
                    "overwrite=True to start afresh"
                )
            return
        os.makedirs(self.run_dir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"train_fingerprint": fingerprint, "rows": self.rows}, f)

    def add_split(self, name, path):
        raise UserError(f"{name}: your own model's splits are datasets given to amptrain.Trainer, not files")

    def signature(self):
        return self.splits_spec()

    def splits_spec(self):
        source = next(iter(self.pieces.sources.values()))
        return source.batches(self.rows).element_spec

    @property
    def steps_per_epoch(self):
        return self._steps_per_epoch

    def train_dataset(self, start_step, share=None):
        # Batch N is the N-th of the data's passes from the start (see keras_data: exact resume).
        # A user's dataset yields whole batches: a worker's share is cut from each.
        dataset = self.pieces.sources["train"].batches(self.rows).repeat().skip(start_step)
        if share is None:
            return dataset
        import tensorflow as tf

        part, parts = share
        rows = self.rows // parts
        return dataset.map(lambda *batch: tf.nest.map_structure(lambda t: t[part * rows : (part + 1) * rows], batch))

    def train_buckets(self):
        return [(0, self.rows)]

    def probe_batches(self):
        """The first training batch, repeated: every batch is filled to its rows, so for data
        of one shape that is the shape every step has (data padded per batch is timed at its
        first batch's length). Its shape: (rows, the token ids' length) where the features
        hold token ids (`keras_data.token_ids_of`), else (rows, the first feature's other
        dimensions)."""
        import tensorflow as tf

        from amptrain.tasks.keras_model.data import token_ids_of

        first = self.pieces.sources["train"].batches(self.rows).take(1).cache()
        features = next(iter(first))[0]
        ids = token_ids_of(features)
        shape = tuple((ids if ids is not None else tf.nest.flatten(features)[0]).shape)
        return first.repeat(), shape

    def probe_identity(self):
        """Names the user's model for the probe's cache, which the config does not describe:
        the builder's qualified name and a hash of the file that defines it, and the
        batches' structure. A model changed in another file keeps its cached decision:
        delete ~/.cache/amptrain/probe/ (`$AMPTRAIN_CACHE_DIR/probe`) to measure it again."""
        return {"builder": describe_builder(self.pieces.model), "batches": str(self.splits_spec())}

    # === Model and loss ===

    def build_model(self, dtype):
        import keras

        model = self.pieces.model
        if not isinstance(model, keras.Model):
            from amptrain.models.builders import build_under_policy

            model = build_under_policy(model, dtype)
        else:
            import tensorflow as tf

            if tf.distribute.get_strategy().num_replicas_in_sync > 1:
                raise UserError(
                    "model: a built model has its variables on one device; to train on several replicas pass a "
                    "builder (model=lambda policy: ...), which amptrain calls under the strategy's scope"
                )
            check_policy(model, dtype)
        if not model.trainable_variables:
            raise UserError(f"model: {model.name!r} has no trainable weights; there is nothing to train")
        self._check_batch(model)
        return model

    def _check_batch(self, model):
        """The first training batch through the model and the loss, eagerly: a structure the
        model does not take or a loss of the wrong shape is one line before any training."""
        import tensorflow as tf

        source = self.pieces.sources.get("train") or next(iter(self.pieces.sources.values()))
        features, targets, _ = next(iter(source.batches(self.rows).take(1)))
        try:
            outputs = model(features, training=False)
        except Exception as error:  # the user's model on the user's data
            found = id_out_of_range(str(error))
            if found is not None:
                where, value, size = found
                layer = re.search(r"calling (\w+)\.call\(\)", str(error))
                raise UserError(
                    f"data: the first training batch holds id {value} at [{where}], past the end of "
                    f"{layer.group(1) if layer else 'a lookup table'}'s {size} rows: expected ids 0 to {int(size) - 1}"
                ) from None
            expected = [(t.name, list(t.shape), t.dtype) for t in tf.nest.flatten(model.inputs)]
            received = tf.nest.map_structure(lambda t: (t.shape.as_list(), t.dtype.name), features)
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            raise UserError(
                f"data: the batches' features do not fit the model's inputs: expected {expected}, received "
                f"{received} ({first})"
            ) from None
        check_loss(self.pieces.loss, targets, outputs)

    def loss(self, targets, outputs):
        return self.pieces.loss(targets, outputs)

    # === Evaluation and prediction ===

    def batches(self, split_name):
        """The split's engine batches, materialized once (the outputs and targets then line up
        whatever the dataset does), as a dataset to predict on and the NumPy list."""
        import tensorflow as tf

        if split_name not in self._materialized:
            source = self.splits[split_name]
            self._materialized[split_name] = list(source.batches(self.rows).as_numpy_iterator())
        kept = self._materialized[split_name]
        spec = self.splits_spec()
        return tf.data.Dataset.from_generator(lambda: iter(kept), output_signature=spec), kept

    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        """{"loss": the mean over real targets, each metric by its name, "examples"}."""
        dataset, kept = self.batches(split_name)
        outputs = predict(dataset)
        total = count = 0.0
        metrics = {}
        for (_, targets, _), output in zip(kept, outputs):
            batch_sum, batch_count = self.pieces.loss(targets, output)
            total, count = total + float(batch_sum), count + float(batch_count)
            for name, make in self.pieces.metrics:
                if name not in metrics:
                    metrics[name] = make() if make is not None else pick_accuracy(targets["y"], output)
                metrics[name].update_state(targets["y"], output, sample_weight=_row_weights(targets))
        scores = {"loss": total / max(count, 1.0)}
        scores.update({name: float(metric.result()) for name, metric in metrics.items()})
        scores["examples"] = int(sum(int((_row_weights(t) > 0).sum()) for _, t, _ in kept))
        if predictions_path:
            live = [o[_row_weights(t) > 0] for (_, t, _), o in zip(kept, outputs) if not isinstance(o, dict)]
            if live:
                np.save(predictions_path + self.predictions_suffix, np.concatenate(live))
        return scores

    def projections(self, model):
        """The embedding the user named (`Trainer(projector_layer=...)`), its rows named by
        `projector_pieces` or by their ids."""
        name = self.pieces.projector_layer
        if name is None:
            return []
        from amptrain.models.layer_tree import walk

        found = [layer for layer in walk(model) if layer.name == name and hasattr(layer, "embeddings")]
        if not found:
            raise UserError(f"projector_layer: the model has no embedding layer named {name!r}")
        table = found[0].embeddings
        pieces = self.pieces.projector_pieces or [str(i) for i in range(int(table.shape[0]))]
        return [(name, table, pieces, None)]

    def predict_texts(self, texts, model, predict):
        raise UserError("your own model predicts from Python: amptrain.Trainer(...).predict(x)")


def describe_builder(builder):
    """ "module.qualname sha256-of-its-file" of a model builder (a function, or an object
    with `__call__`); the file hash is "?" where its source cannot be read."""
    import hashlib
    import inspect

    target = builder if inspect.isfunction(builder) or inspect.ismethod(builder) else type(builder)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    try:
        with open(inspect.getsourcefile(target), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError):  # built in a notebook cell or from C: its name alone
        digest = "?"
    return f"{name} {digest}"


def _row_weights(targets):
    """(rows,) weights: a per-target weight array gives each row its first target's."""
    weights = np.asarray(targets["w"])
    return weights if weights.ndim == 1 else weights.reshape(len(weights), -1).max(axis=1)


def check_policy(model, policy):
    """A built model must follow the named policy, but for its float32 islands: the first
    layer that does neither is named."""
    import keras

    from amptrain.models.layer_tree import walk

    for layer in list(walk(model))[1:]:
        if isinstance(layer, keras.layers.InputLayer):
            continue  # an input computes nothing
        name = layer.dtype_policy.name
        if name not in (policy, "float32"):
            raise UserError(
                f"model: layer {layer.name!r} computes under {name!r}, not precision.policy {policy!r} (or a "
                "float32 island); build the model under that policy, or pass a builder: model=lambda policy: ..."
            )
