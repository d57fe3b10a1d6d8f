"""`amptrain.Trainer`: your own Keras model through amptrain's engine.

    import amptrain, keras
    trainer = amptrain.Trainer(
        model=build_transformer_model,            # policy name -> keras.Model, built by amptrain
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        train=train_ds, validation=val_ds, test=test_ds,  # tf.data.Datasets of (x, y[, sample_weight]) batches
        optimizer=keras.optimizers.AdamW(1e-3),  # or a function that makes one; default: the config's
        callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)],
        precision="mixed_float16", steps_per_execution=50, epochs=3,  # or config={"train.epochs": 3, ...}
        run_dir="runs/mine",
    )
    history = trainer.fit()       # history.history["val_loss"], history.test: the best checkpoint's
    trainer.evaluate("test")      # {"loss": ..., "accuracy": ..., "examples": ...}
    trainer.predict(x)            # the model's outputs for x (a dataset or arrays)
    trainer.export()              # runs/mine/export/1: a SavedModel with the model's own signature
    trainer.bench()               # precisions x XLA x steps per execution: runs/mine/bench/report.md

The model is a builder (called with the policy name, under that policy and the strategy's
scope: every replica gets its variables), or a built model when `precision.policy` is named
and one device trains it. Layers that declare float32 are islands. `config` takes the
`[precision]`, `[runtime]` and `[train]` keys of a TOML config, dotted, checked as a file's
are. The engine does the rest as for the built-in tasks: loss scaling and its telemetry, the
overflow locator, the NaN policy, XLA modes, steps per execution, accumulation, the weight
average, `mirrored` and several workers (each batch is a global batch, split over the
replicas), exact resume (see `tasks/keras_model/data.py` for what the data must satisfy) and a
SIGTERM that saves first.
"""

import logging
import os

from amptrain.errors import UserError

logger = logging.getLogger("amptrain")
SECTIONS = ("precision", "runtime", "train")


# The keyword settings a Keras user types, and the config key each one is.
KEYWORDS = {
    "epochs": "train.epochs",
    "steps": "train.steps",
    "batch_size": "train.batch_size",
    "precision": "precision.policy",
    "steps_per_execution": "runtime.steps_per_execution",
    "jit_compile": "runtime.jit_compile",
    "seed": "runtime.seed",
}
# The config's optimizer: with optimizer= they do not apply (with a learning-rate schedule,
# the optimizer's kind and its weight decay still do).
OPTIMIZER_KEYS = ("train.optimizer", "train.weight_decay", "train.learning_rate", "train.warmup_steps",
                  "train.decay", "train.clip_norm")  # fmt: skip
SCHEDULE_KEYS = ("train.learning_rate", "train.warmup_steps", "train.decay")


class Trainer:
    def __init__(
        self,
        model,
        loss,
        metrics=(),
        train=None,
        dev=None,
        test=None,
        config=None,
        run_dir="runs/keras-model",
        monitor=None,
        monitor_mode=None,
        batch_size=None,
        overwrite=False,
        optimizer=None,
        callbacks=(),
        validation=None,
        epochs=None,
        steps=None,
        precision=None,
        steps_per_execution=None,
        jit_compile=None,
        seed=None,
        projector_layer=None,
        projector_pieces=None,
    ):
        from amptrain.tasks.keras_model.callbacks import check_callbacks
        from amptrain.tasks.keras_model.scoring import as_loss, as_metrics

        if train is None:
            raise UserError("train: expected the training data (a tf.data.Dataset of batches, or arrays)")
        if dev is not None and validation is not None:
            raise UserError("validation and dev: both name the split scored during training; give one")
        dev = validation if validation is not None else dev
        given = dict(
            batch_size=batch_size, epochs=epochs, steps=steps, precision=precision,
            steps_per_execution=steps_per_execution, jit_compile=jit_compile, seed=seed,
        )  # fmt: skip
        config = _merge_keywords(config, {k: v for k, v in given.items() if v is not None})
        _check_optimizer_keys(config, optimizer)
        self.config = _config(config)
        _set_up_devices(self.config.runtime)  # before the data below runs TensorFlow's first op
        self.config = _global_batch(self.config, config, train)
        self.run_dir = os.path.abspath(run_dir)
        self.overwrite = overwrite
        self.model = model
        self.loss = as_loss(loss)
        self.metrics = as_metrics(metrics)
        self.optimizer = optimizer
        self.callbacks = check_callbacks(callbacks, optimizer)
        self.projector = (projector_layer, projector_pieces)  # an embedding for TensorBoard's projector
        self.monitor, self.higher_is_better = _monitor(self.metrics, monitor, monitor_mode)
        self.batch_size = self.config.train.batch_size
        self.splits = {"train": train, "dev": dev, "test": test}

    def __repr__(self):
        splits = ", ".join(name for name, value in self.splits.items() if value is not None)
        return (
            f"Trainer(run_dir={self.run_dir!r}, policy={self.config.precision.policy!r}, "
            f"monitor={self.monitor!r}, splits: {splits})"
        )

    # === The run ===

    def fit(self):
        """Trains (or resumes) into `run_dir`; returns its `History`, as Keras's `model.fit`
        does: `history.history["loss"]`, `["val_loss"]`, ... a value an epoch (an evaluation
        interval), and `history.test`, the best checkpoint's test metrics ({} without a test
        split)."""
        from amptrain import api

        if isinstance(self.model, _keras_model()) and self.config.precision.policy == "auto":
            raise UserError(
                "model: a built model needs precision.policy named (it was built under one); or pass a builder"
            )
        from amptrain.engine.history import History

        test = api.fit_config(self._resolved(), self.run_dir, self.overwrite, make_task=self._task)["test"]
        return History.of_run(self.run_dir, test)

    def evaluate(self, split="test"):
        """{"loss", each metric by its name, "examples"} of a split with the best checkpoint."""
        task, model, predict = self._load()
        if split not in task.splits:
            raise UserError(f"evaluate: no {split!r} data was given to the Trainer")
        return task.evaluate(split, model, predict)

    def predict(self, x):
        """The model's outputs (NumPy, or a dict of them) for `x`: a dataset of feature batches
        (or of (features, ...) tuples), or arrays (batched by `batch_size`)."""
        import numpy as np
        import tensorflow as tf

        from amptrain.tasks.keras_model.data import SplitSource

        _, model, predict = self._load()
        source = SplitSource.of(_with_targets(x), "predict", self.batch_size)
        batches = source.batches(source.rows())
        kept = []
        # The outputs of each batch, less its filler rows (weight 0), in order.
        for output, (_, targets, _) in zip(predict(batches), batches.as_numpy_iterator()):
            live = np.asarray(targets["w"]) > 0
            kept.append(tf.nest.map_structure(lambda o, live=live: o[live], output))
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *kept)

    def export(self, out=None, version=1, overwrite=False, checkpoint="best"):
        """A SavedModel of the best checkpoint with the model's own `serving_default`
        signature, at `out`/`version` (default run_dir/export/1); returns where and its size.
        On a cluster only the chief exports (the others return None)."""
        from amptrain.distribute import Cluster
        from amptrain.exports import export_run

        if not Cluster.from_env(source=self.config.runtime.cluster).is_chief:
            return None
        return export_run(
            self.run_dir, out, checkpoint=checkpoint, version=version, overwrite=overwrite, make_task=self._task
        )

    def bench(
        self,
        precisions=("float32", "mixed_bfloat16", "mixed_float16"),
        jit=(False, True),
        steps_per_execution=(1, 20),
        steps=30,
        repeats=3,
        out_dir=None,
    ):
        """`amptrain bench` of your model: each combination of precision, XLA (False, True or
        "fusible") and steps per execution built from your builder and timed on your training
        batches; real tokens/s, step-time percentiles, compile time, MFU, peak memory and the
        speed-up against float32 / XLA off / 1 step a call. Writes results.json, report.md and
        plots into `out_dir` (default run_dir/bench) and returns the results (`["rows"]`).
        The combinations run in this process one after another (`bench/in_process.py`)."""
        from amptrain.bench.in_process import bench_in_process
        from amptrain.bench.runner import Grid
        from amptrain.tasks.keras_model.task import describe_builder

        if isinstance(self.model, _keras_model()):
            raise UserError("bench: a built model cannot be rebuilt under each precision; pass a builder (model=...)")
        grid = Grid(tuple(precisions), tuple(jit), tuple(steps_per_execution))
        out_dir = os.path.abspath(out_dir or os.path.join(self.run_dir, "bench"))
        description = f"your model: {describe_builder(self.model).split()[0]}"
        return bench_in_process(self._task, self.config, grid, steps, repeats, out_dir, description)

    def memory(self, precisions=None, memory_limit=None):
        """What training your model needs in memory, estimated before it trains (as `amptrain
        doctor --memory` does for a config): a record a precision with the bytes of the weights,
        gradients, optimizer slots, the activations a row of the batch (the traced step's peak),
        the runtime's own, the total at your batch size and, given `memory_limit` (bytes or
        "4GiB"), the largest batch under it. `precisions`: default the config's policy, or all
        three with a builder and `precision.policy = "auto"`; a built model has its own."""
        from amptrain.bench.memory_plan import plan_yours

        built = isinstance(self.model, _keras_model())
        return plan_yours(self._resolved(), built, precisions, memory_limit, self._task)

    # === Parts ===

    def _resolved(self):
        """The config the run takes. `auto` is measured on your model by the precision probe
        (`autoprecision/trials.py`), which builds each candidate afresh from a builder; a built
        model cannot be rebuilt, so its `runtime.jit_compile = "auto"` takes the hardware
        rule (said in the log)."""
        import dataclasses

        from amptrain.autoprecision import probe

        config = self.config
        if isinstance(self.model, _keras_model()) and config.runtime.jit_compile == "auto":
            candidate, why = probe.rule(config.precision, config.runtime, probe.Hardware.detect())
            logger.info(f"a built model is not measured: the hardware rule, XLA {candidate.jit_compile} ({why})")
            config = dataclasses.replace(
                config, runtime=dataclasses.replace(config.runtime, jit_compile=candidate.jit_compile)
            )
        return config

    def _task(self, config, run_dir):
        from amptrain.tasks.keras_model.data import SplitSource
        from amptrain.tasks.keras_model.task import KerasModelTask, UserPieces

        seed = config.runtime.seed
        sources = {
            name: SplitSource.of(value, name, self.batch_size, seed=seed, shuffle=name == "train")
            for name, value in self.splits.items()
            if value is not None
        }
        from amptrain.tasks.keras_model.callbacks import KerasCallbacks

        callbacks = KerasCallbacks(self.callbacks)
        mine = (self.model, self.loss, self.metrics, sources, self.monitor, self.higher_is_better, self.optimizer)
        pieces = UserPieces(*mine, callbacks, *self.projector)
        return KerasModelTask(config, run_dir, pieces)

    def _load(self):
        """(task, model with the best checkpoint's weights, the engine's predict)."""
        import tensorflow as tf

        from amptrain import config as config_lib
        from amptrain.autoprecision import probe
        from amptrain.engine.checkpoints import restore_weights
        from amptrain.engine.step_runner import StepRunner

        saved = os.path.join(self.run_dir, "config.toml")
        if not os.path.exists(saved):
            raise UserError(f"{self.run_dir}: no run here yet; call fit() first")
        config = probe.resolved_for(config_lib.load_config(saved, base_dir=self.run_dir), self.run_dir)
        task = self._task(config, self.run_dir)
        task.prepare(tuple(name for name, value in self.splits.items() if value is not None))
        model, _, _ = task.create_model()
        try:
            restore_weights(model, os.path.join(self.run_dir, "checkpoints"))
        except FileNotFoundError:
            raise UserError(f"{self.run_dir}: no checkpoint yet; call fit() first") from None
        runner = StepRunner(tf.distribute.get_strategy(), model, None, None, jit_compile=config.runtime.jit_compile)
        return task, model, runner.predict


def configure_devices(config):
    """What must precede TensorFlow's first op, for a Trainer of this `config` dict: the CPU
    split into `runtime.cpu_replicas` logical devices (`mirrored` on one CPU, as the tests
    do), and on a cluster (`TF_CONFIG`) the multi-worker strategy. Call it before your data
    pipeline runs anything; a Trainer built later finds them set."""
    from amptrain import distribute

    runtime = _config(dict(config or {})).runtime
    distribute.configure_devices(runtime)
    cluster = distribute.Cluster.from_env(source=runtime.cluster)
    if cluster.is_multi_worker:
        distribute.select_strategy(runtime, cluster)


def _monitor(metrics, monitor, monitor_mode):
    """(the score that picks the best checkpoint, whether higher is better): `monitor` as
    Keras names it ("val_loss" is "loss"), by default the first metric, else the loss."""
    names = ["loss", *(name for name, _ in metrics)]
    monitor = (monitor or (names[1] if len(names) > 1 else "loss")).removeprefix("val_")
    if monitor not in names:
        raise UserError(f"monitor: {monitor!r} is never computed; expected one of {names}")
    mode = monitor_mode or ("min" if monitor == "loss" else "max")
    if mode not in ("min", "max"):
        raise UserError(f"monitor_mode: expected 'min' or 'max', received {monitor_mode!r}")
    return monitor, mode == "max"


def _global_batch(resolved, config, train):
    """The config with the data's global batch: arrays are batched by train.batch_size, a
    dataset's first batch says (the run record and the replica split check read it); a
    batch_size that a dataset's batches disagree with is refused, not silently replaced."""
    from amptrain.tasks.keras_model.data import SplitSource

    rows = SplitSource.of(train, "train", resolved.train.batch_size).rows()
    if rows == resolved.train.batch_size:
        return resolved
    if "train.batch_size" in config and not isinstance(train, (tuple, list)):  # arrays: ours to batch
        raise UserError(
            f"batch_size: {config['train.batch_size']}, but the train dataset's batches have {rows} rows; "
            "batch the dataset by it, or leave batch_size out (a dataset's batches are its own)"
        )
    return _config({**config, "train.batch_size": rows})


def _merge_keywords(config, keywords):
    """The dotted config with the keyword settings (`KEYWORDS`) added; a key given both ways
    is refused."""
    if config is not None and not isinstance(config, dict):
        raise UserError(f"config: expected a dict of dotted keys, e.g. {{'train.epochs': 3}}, received {config!r}")
    merged = dict(config or {})
    for name, value in keywords.items():
        key = KEYWORDS[name]
        if key in merged:
            raise UserError(f"{name}= and config[{key!r}]: the same setting given twice; give one")
        merged[key] = value
    return merged


def _check_optimizer_keys(config, optimizer):
    """With optimizer=, the config's optimizer keys would be silently ignored: refused."""
    import keras

    if optimizer is None:
        return
    schedule = isinstance(optimizer, keras.optimizers.schedules.LearningRateSchedule)
    for key in SCHEDULE_KEYS if schedule else OPTIMIZER_KEYS:
        if key in config:
            what = (
                "the learning-rate schedule given as optimizer=" if schedule else "your optimizer=, as under model.fit"
            )
            raise UserError(f"config[{key!r}]: does not apply with optimizer= (the run follows {what}); set it there")


def _set_up_devices(runtime):
    """The logical CPU devices `runtime.cpu_replicas` asks for, set before TensorFlow's first
    op; where something ran one already, says what to call first."""
    from amptrain import distribute
    from amptrain.errors import ConfigError

    try:
        distribute.configure_devices(runtime)
    except ConfigError:
        raise UserError(
            f"runtime.cpu_replicas = {runtime.cpu_replicas}: TensorFlow already ran an op in this process (your "
            "datasets, say), and logical devices can only be set before; call "
            f"amptrain.configure_devices({{'runtime.cpu_replicas': {runtime.cpu_replicas}}}) first"
        ) from None


def _config(values):
    """The run's Config from dotted `[precision]`, `[runtime]` and `[train]` keys."""
    from amptrain.config import config_from_dict

    if not isinstance(values, dict):
        raise UserError(f"config: expected a dict of dotted keys, e.g. {{'train.epochs': 3}}, received {values!r}")
    for key in values:
        if key.partition(".")[0] not in SECTIONS or "." not in key:
            raise UserError(
                f"config: {key!r} is not for your own model; it takes the keys of [precision], [runtime] and "
                "[train] (e.g. 'train.epochs'); the data and the model are yours"
            )
    return config_from_dict({"task": "keras_model"}, list(values.items()), source="config")


def _with_targets(x):
    """`x` as (features, dummy targets): batches of a dataset, or arrays to batch."""
    import numpy as np
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):

        def features_only(*element):  # a dataset of features, or of (features, targets[, weights])
            features = element[0]
            return features, tf.zeros([tf.shape(tf.nest.flatten(features)[0])[0]], tf.float32)

        return x.map(features_only)
    rows = len(tf.nest.flatten(x)[0])
    return (x, np.zeros(rows, np.float32))


def _keras_model():
    import keras

    return keras.Model
