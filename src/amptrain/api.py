"""The Python entry points behind the CLI: fit, evaluate, predict, export, audit.

import amptrain
amptrain.fit("configs/classify-spam.toml", overrides={"train.steps": 200})
amptrain.evaluate("runs/classify-spam", split="test")
amptrain.predict("runs/classify-spam", ["see you at lunch"])
amptrain.audit("configs/classify-spam.toml", policy="mixed_float16")["risks"]  # []
amptrain.export("runs/classify-spam")         # runs/classify-spam/export/1: a SavedModel taking raw text
amptrain.predict("runs/classify-spam/export", ["see you at lunch"])   # the same records, from the export
"""

import json
import os
import shutil
import tempfile

from amptrain import config as config_lib
from amptrain.engine import sanity
from amptrain.engine.run_folder import disk_full, learned_files, ownership
from amptrain.engine.run_folder.lock import RunLock, hold
from amptrain.errors import ConfigError, NumericsError, UserError

RUNS_DIR = "runs"


def fit(config_path, overrides=(), run_dir=None, overwrite=False):
    """Trains (or resumes) a run; returns {"run_dir", "test": test metrics}.

    In a multi-worker cluster (TF_CONFIG) every worker calls this with the same
    arguments; only the chief (worker 0) writes into `run_dir`."""
    config = config_lib.load_config(config_path, overrides)
    run_dir = run_dir or os.path.join(RUNS_DIR, os.path.splitext(os.path.basename(config_path))[0])
    return fit_config(config, run_dir, overwrite)


def fit_config(config, run_dir, overwrite=False, make_task=None):
    """`fit` of a loaded config; `make_task(config, run_dir)` builds its task (default: the
    one the config names, `tasks.create_task`; `amptrain.Trainer` gives one made of the
    user's pieces), which then takes the same path as any other."""
    from amptrain.distribute import Cluster

    run_dir = os.path.abspath(run_dir)
    cluster = Cluster.from_env(source=config.runtime.cluster)
    lock = RunLock(run_dir, "fit").acquire() if cluster.is_chief else None  # one writer a folder
    write_dir = run_dir
    try:
        if cluster.is_chief:
            _claim_run_dir(config, run_dir, overwrite)  # saves the config as given, check-numerics or not
        else:
            # The others write into a folder of their own, removed at the end.
            write_dir = tempfile.mkdtemp(prefix=f"amptrain-worker{cluster.index}-")
        return _fit(config, run_dir, write_dir, cluster, make_task)
    except Exception as error:
        explained = disk_full.explain(error, run_dir)
        if explained is None:
            raise
        raise explained from None
    finally:
        if write_dir != run_dir:
            shutil.rmtree(write_dir, ignore_errors=True)
        if lock is not None:
            lock.release()


def _fit(config, run_dir, write_dir, cluster, make_task=None):
    from amptrain import distribute, xla_modes
    from amptrain.autoprecision import probe
    from amptrain.engine.run_log import setup_logging
    from amptrain.precision import check_numerics
    from amptrain.tasks import create_task

    # Only the chief reports progress on the terminal; the others their warnings and errors.
    logger = setup_logging(write_dir, quiet_console=not cluster.is_chief)
    logger.info(f"run folder {run_dir}")
    sanity.warn_about_config(config.train)
    task = (make_task or create_task)(config, run_dir)
    learned_files.check(run_dir)  # a resume trains on with the files its checkpoints index
    placement, choice, winner = _prepare(config, task, cluster, run_dir)
    if cluster.is_chief:
        learned_files.record(run_dir, learned_files.names(task))
        _record_task_code(config.task, run_dir)
    logger.info(probe.summary(choice))
    xla_asked = xla_modes.uses_xla(config.runtime.jit_compile)  # check-numerics says it turns that off
    config = probe.apply(config, choice)  # the run's config, resolved once
    task = task.with_config(config)

    try:
        if not config.runtime.check_numerics:
            test_metrics = _train(task, config, run_dir, write_dir, cluster, placement, choice, winner)
        else:
            try:
                checked = check_numerics.enable(config, xla_asked)
                test_metrics = _train(task, checked, run_dir, write_dir, cluster, placement, choice, winner)
            finally:
                # Process-wide for this thread: a later fit in the same process must not inherit it.
                check_numerics.disable()
    except Exception as error:
        lost = distribute.explain_lost_peer(error, cluster)
        if lost:
            from amptrain.errors import PeerLost

            raise PeerLost(lost) from error
        raise
    if test_metrics:
        shown = "  ".join(f"{k} {v:.4f}" for k, v in test_metrics.items() if isinstance(v, float))
        logger.info(f"test (best checkpoint): {shown}")
    logger.info(
        f"results in {run_dir}: metrics.jsonl, predictions-test{task.predictions_suffix}, tensorboard/, checkpoints/"
    )
    return {"run_dir": run_dir, "test": test_metrics}


def _record_task_code(task_name, run_dir):
    """A user's task module, run by this fit: trusted by this user from now on
    (`registry.trust_task_code`), and where it was and its SHA-256 in the run folder."""
    from amptrain import registry
    from amptrain.files import atomic_write

    record = registry.trust_task_code(task_name)
    if record is not None:
        atomic_write(os.path.join(run_dir, registry.CODE_RECORD_FILE), json.dumps(record, indent=2) + "\n")


def _prepare(config, task, cluster, run_dir):
    """Reads the data, learns (or reads) the vocabulary, chooses the strategy and decides
    the precision (`autoprecision.decision`). Returns (placement, precision decision,
    the probe's winner to train or None)."""
    from amptrain import distribute

    distribute.configure_devices(config.runtime)
    if cluster.is_multi_worker:
        # The strategy must exist before TensorFlow runs anything (it sets up the
        # collectives). The chief learns the vocabulary and labels into the run folder
        # first; the others then read them, so every worker tokenises alike.
        from amptrain.distribute.startup import startup_watch

        with startup_watch(cluster, config.runtime.startup_timeout):  # names who never arrived; SIGTERM at once
            placement = distribute.select_strategy(config.runtime, cluster)
        distribute.check_split(config, placement.strategy)
        # So does the precision: the chief decides (measuring on its own device if need
        # be) and the others read its decision.
        if cluster.is_chief:
            import tensorflow as tf

            task.prepare()
            choice, winner = _decide_precision(config, task, tf.distribute.get_strategy(), run_dir)
        distribute.barrier(placement.strategy)
        if not cluster.is_chief:
            task.prepare()
            choice, winner = _chiefs_choice(run_dir), None
        distribute.check_split(config, placement.strategy, task)
    else:
        placement = distribute.select_strategy(config.runtime, cluster)
        distribute.check_split(config, placement.strategy)  # before the data is read and the vocabulary learned
        task.prepare()  # reads and checks the data: a bad row stops the run here
        distribute.check_split(config, placement.strategy, task)
        choice, winner = _decide_precision(config, task, placement.strategy, run_dir)
    return placement, choice, winner


def _decide_precision(config, task, strategy, run_dir):
    """The precision decision, made once (the run folder's on resume), written to the run folder."""
    from amptrain.autoprecision import probe
    from amptrain.autoprecision.decision import decide_precision

    path = os.path.join(run_dir, probe.RECORD_FILE)
    choice, winner = decide_precision(task, config, probe.ProbeCache(), strategy, recorded=probe.read_record(path))
    probe.write_record(path, choice)
    return choice, winner


def _chiefs_choice(run_dir):
    from amptrain.autoprecision import probe

    record = probe.read_record(os.path.join(run_dir, probe.RECORD_FILE))
    if record is None:
        raise UserError(
            f"{run_dir}/{probe.RECORD_FILE}: the chief's precision decision is not readable here; "
            "every worker must see the run folder (as for the vocabulary)"
        )
    return record


def _train(task, config, run_dir, write_dir, cluster, placement, choice, winner):
    """Builds the model under the strategy and trains; returns the test metrics.

    In check-numerics mode the first NaN or inf raises NumericsError naming its op and layer."""
    from amptrain.autoprecision.decision import model_for_run
    from amptrain.engine.job import Job
    from amptrain.engine.loop import run_training
    from amptrain.precision import check_numerics

    model, policy, parts = model_for_run(task, placement.strategy, choice, winner)  # the probe's winner, or afresh
    reason = choice.reason
    job = Job(
        model=model,
        loss_fn=task.loss,
        train_dataset=task.train_dataset,
        steps_per_epoch=task.steps_per_epoch,
        evaluate=task.evaluate,
        primary_metric=task.primary_metric,
        has_dev="dev" in task.splits,
        has_test="test" in task.splits,
        learning_rates=task.learning_rate_scales,
        higher_is_better=task.higher_is_better,
        parts=parts if task.optimizer is None else None,  # the probe's (a user's optimizer is built afresh)
        optimizer=task.optimizer,
        callbacks=task.callbacks,
        projections=task.projections,
        data_figures=task.data_figures(),
    )
    try:
        return run_training(job, config, run_dir, placement, policy, reason, cluster, write_dir, choice)
    except Exception as error:
        if config.runtime.check_numerics and check_numerics.detected(error):
            raise NumericsError(check_numerics.explain(error, model)) from error
        raise


def _claim_run_dir(config, run_dir, overwrite):
    """Refuses to resume a run folder whose config differs in more than run length. A
    folder whose run never trained a step (it stopped on a data error, say) does not block
    its own retry: it is started afresh. Only what amptrain wrote is ever deleted
    (`run_folder.ownership`); a folder holding files of a run's names that amptrain did not
    write is refused before anything is written."""
    saved_path = os.path.join(run_dir, "config.toml")
    try:
        ownership.claim(run_dir)
    except OSError as error:
        raise UserError(
            f"{run_dir}: cannot write the run folder ({error.strerror}); pass --run-dir a folder you can write"
        ) from None
    if overwrite:
        ownership.empty(run_dir)
    elif os.path.exists(saved_path):
        try:
            saved = config_lib.load_config(saved_path, base_dir=run_dir, carried_by=run_dir)
            differing = config_lib.differing_keys(saved, config)
        except ConfigError as error:
            if not _never_trained(run_dir):
                raise ConfigError(f"{saved_path}: the run's saved config no longer loads: {error}") from None
            differing = [f"the saved config ({error})"]  # a start that failed on it: started afresh
        if differing and _never_trained(run_dir):
            ownership.empty(run_dir)  # only what the failed start wrote: config, learned files, log
        elif differing:
            raise ConfigError(
                f"{run_dir} holds a run with a different config ({', '.join(differing)}); "
                "pass --overwrite to start afresh, or --run-dir for a new folder"
            )
    try:
        config_lib.save_config(config, saved_path)
    except OSError as error:
        raise UserError(
            f"{run_dir}: cannot write the run folder ({error.strerror}); pass --run-dir a folder you can write"
        ) from None


def _never_trained(run_dir):
    """True when `run_dir` holds no checkpoint and no training record: nothing to lose."""
    from amptrain.engine.run_folder.checkpoint_files import step_prefixes
    from amptrain.engine.run_log import read_metrics

    if step_prefixes(os.path.join(run_dir, "checkpoints")):
        return False
    return not any(r.get("kind") in ("train", "eval") for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")))


def load_run(run_dir, split_names, trust_run_code=False, overrides=(), precision=None):
    """A trained run's task, its model with the best weights, a predict function over that
    model, and the checkpoint's path. `trust_run_code`: import the user task module the
    run's config names even if this user never ran `fit` with it (`registry.task_class`).
    `overrides`: of the sections a run may change after training (`[decode]`, `[generate]`)."""
    import tensorflow as tf

    from amptrain.autoprecision import probe
    from amptrain.engine.checkpoints import restore_weights
    from amptrain.engine.step_runner import StepRunner
    from amptrain.exports.loading import load_config, pretrained_policy
    from amptrain.tasks import create_task
    from amptrain.tasks.language_model.pretrained_folder import is_pretrained_folder, load_pretrained

    if is_pretrained_folder(run_dir):
        task, model, weights = load_pretrained(run_dir, overrides, pretrained_policy(precision))
        return (
            task,
            model,
            StepRunner(tf.distribute.get_strategy(), model, None, None, jit_compile=False).predict,
            weights,
        )
    if precision is not None:
        raise UserError(f"{run_dir}: --precision is for a pretrained folder; a run predicts in its own")
    config = load_config(run_dir, overrides, splits=split_names, trust=trust_run_code)  # data files: those read
    config = probe.resolved_for(config, run_dir)
    task = create_task(config, run_dir)
    learned_files.check(run_dir)
    task.prepare(split_names)
    model, _, _ = task.create_model()
    try:
        checkpoint = restore_weights(model, os.path.join(run_dir, "checkpoints"), learned_files.names(task))
    except FileNotFoundError:
        raise UserError(f"{run_dir}: no checkpoint yet; train first with `amptrain fit`") from None
    trainer = StepRunner(tf.distribute.get_strategy(), model, None, None, jit_compile=config.runtime.jit_compile)
    return task, model, trainer.predict, checkpoint


def evaluate(run_dir, split="test", data=None, trust_run_code=False):
    """Scores a split (or another labelled file) with the run's best checkpoint."""
    from amptrain.engine.run_log import setup_logging

    if not os.path.exists(os.path.join(run_dir, "config.toml")):  # before the log goes there
        raise UserError(f"{run_dir}: no config.toml; expected a run folder made by `amptrain fit`")
    with hold(run_dir, "eval"):  # it writes train.log: not beside a fit
        setup_logging(run_dir)
        task, model, predict_fn, checkpoint = load_run(run_dir, () if data else (split,), trust_run_code)
        if data:
            split = "data"
            task.add_split(split, os.path.abspath(data))
        elif split not in task.splits:
            raise UserError(f"{run_dir}: the run's config has no data.{split} file; pass --data PATH")
        metrics = task.evaluate(split, model, predict_fn)
    return {"split": split, "checkpoint": os.path.basename(checkpoint), **metrics}


def predict(run_dir, texts, skip_blank=False, trust_run_code=False, overrides=(), precision=None):
    """One record a text with the run's best checkpoint: the label and class probabilities
    (classification), the tags and entities (ner), the translation (translation).
    `skip_blank` (lines of a file): blank texts are left out, except by translation,
    which translates a blank line to a blank line. `run_dir` may be an export folder
    (`export`): its SavedModel then answers, and no model is built. `trust_run_code`: as
    `load_run`'s; `overrides`: how to continue or decode (`generate.temperature=0.8`), a run's
    own settings else. `run_dir` may also be a pretrained language model's folder (GPT-2,
    Llama 3, Qwen2, Gemma: `tasks/language_model/pretrained_folder.py`), continuing the texts before any
    fine-tuning, under `precision` (float32, bfloat16, float16; float32 unless named)."""
    return predictor(run_dir, skip_blank, trust_run_code, overrides, precision)(list(texts))


def chat(run_dir, texts, system=None, trust_run_code=False, overrides=(), precision=None):
    """One reply a text, the text a user's message (after a system message `system`), through
    the model's chat template: {"messages", "reply"} (`amptrain predict --chat`). `run_dir`: a
    language model's run on a pretrained folder, or such a folder (or `.gguf`) itself."""
    from amptrain.serving.served import find_export
    from amptrain.tasks.language_model import LanguageModelTask
    from amptrain.tasks.language_model.conversations import replies

    if find_export(run_dir) is not None:
        raise UserError(f"{run_dir}: --chat needs the model's chat template; predict with the run or the folder")
    task, model, _, _ = load_run(run_dir, (), trust_run_code, overrides, precision)
    if not isinstance(task, LanguageModelTask):
        raise UserError(f"{run_dir}: --chat is for a language model on a pretrained folder")
    return replies(task, model, list(texts), system)


def predictor(run_dir, skip_blank=False, trust_run_code=False, overrides=(), precision=None):
    """`predict` with the model (or the export) loaded once: a callable texts -> records, whose
    `task_class` is the Task subclass that makes them."""
    from amptrain.serving.streaming import predictor as streaming_predictor

    return streaming_predictor(run_dir, skip_blank, load_run, trust_run_code, overrides, precision)


def export(run_dir, out=None, fmt="saved_model", checkpoint="best", version=1, overwrite=False, **options):
    """Exports a run (`amptrain.exports.export_run`): a SavedModel taking raw text in TF
    Serving's layout, `out`/`version` (default `run_dir`/export/1), with `fmt="onnx"` the
    ONNX model of its token-ids graph; a fine-tuned pretrained language model with
    `fmt="transformers"` as that family's folder (`out`, default `run_dir`/export-transformers),
    with `fmt="gguf"` as one llama.cpp file. Returns where it went and its size. `options`:
    precision ("float32"), overrides, trust_run_code, quantize (gguf: "f32", ..., "q8_0")."""
    from amptrain.exports import export_run

    options["trust"] = options.pop("trust_run_code", False)
    return export_run(run_dir, out, fmt, checkpoint, version, overwrite, **options)


def audit(config_path, overrides=(), policy=None):
    """The precision audit (`amptrain.precision.audit`) of the config's model, built as `fit`
    builds it; `policy` replaces `precision.policy`. Reads the training split (the
    vocabulary and labels size the model) and writes nothing."""
    if policy is not None:
        overrides = [*(overrides.items() if isinstance(overrides, dict) else overrides), ("precision.policy", policy)]
    config = config_lib.load_config(config_path, overrides)
    from amptrain.precision.audit import audit_model
    from amptrain.tasks import prepared_in_scratch

    task = prepared_in_scratch(config)
    model, policy, reason = task.create_model()
    features, targets, _ = task.signature()
    m = config.model
    sizes = {
        "model.hidden_dim": m.hidden_dim,
        "model.intermediate_dim": m.intermediate_dim,
        "model.hidden_dim / model.num_heads": m.hidden_dim // m.num_heads,  # the head size
    }
    report = audit_model(model, policy, config.precision.loss_scale, features, task.loss, targets, sizes)
    return {"config": str(config_path), "policy_reason": reason, **report}
