"""The fit loop: train in chunks of `steps_per_execution`, log, evaluate, checkpoint, resume.

    job = Job(model, task.loss, task.train_dataset, task.steps_per_epoch, task.evaluate, "accuracy")
    run_training(job, config, run_dir, placement, policy="float32", policy_reason="...")

The engine knows no task: a `Job` (`engine/job.py`) hands it a model, a loss, a dataset factory and an
evaluation callable (the Task contract's, `tasks/base.py`), and it runs them.

On several workers every worker runs this same loop in lockstep (each graph call and
each evaluation holds collectives), reads checkpoints from the chief's `run_dir`, and
writes into its own `write_dir`: the chief's is `run_dir`, the others' are temporary
folders that the caller removes (TensorFlow's multi-worker saving asks every worker to
save, the others to places of their own).
"""

import contextlib
import logging
import os
import threading
import time

from amptrain import distribute
from amptrain.engine.build import build_training
from amptrain.engine.checkpoints import Checkpoints
from amptrain.engine.histograms import Histograms
from amptrain.engine.memory import run_estimate
from amptrain.engine.numerics import NumericsWatch
from amptrain.engine.optimizer import current_learning_rate
from amptrain.engine.profiling import StepProfiler
from amptrain.engine.projector import write_projector
from amptrain.engine.run_end import final_test, finished, stopped_by_callback, weights_fingerprint, write_eval
from amptrain.engine.run_log import (
    EVERY_WORKER,
    LOGGER_NAME,
    MetricsLog,
    Progress,
    Scalars,
    Window,
    announce,
    read_metrics,
    run_record,
)
from amptrain.engine.signals import evaluation_missed, sigterm_flag
from amptrain.engine.step_runner import NONFINITE_LOSS, RUNNING
from amptrain.engine.utilisation import Utilisation
from amptrain.errors import Interrupted, NumericsError

logger = logging.getLogger(LOGGER_NAME)


def run_training(job, config, run_dir, placement, policy, policy_reason, cluster=None, write_dir=None, choice=None):
    """Trains (or resumes) and scores the test split with the best checkpoint. `placement`:
    the strategy and why (`distribute.select_strategy`), whose replicas can share the
    global batch (`api` checks that before any work: `distribute.check_split`).

    `choice`: the precision decision (`autoprecision.probe.Decision`) for the run record.
    Returns the final test metrics (or {} without a test split)."""
    cluster = cluster or distribute.Cluster()
    write_dir = write_dir or run_dir
    steps_per_epoch = max(1, job.steps_per_epoch // config.train.accumulation_steps)  # a step: K batches
    steps = config.train.total_steps(steps_per_epoch)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if any(r.get("kind") == "end" for r in read_metrics(metrics_path)):
        return finished(run_dir, metrics_path, steps)
    parts = job.parts or _build_parts(job, config, placement.strategy, policy, steps)
    checkpoints = Checkpoints(
        os.path.join(write_dir, "checkpoints"),
        job.model,
        parts.optimizer,
        parts.trainer.step,
        parts.checkpoint_state(),
        config.train.max_to_keep,
        source=os.path.join(run_dir, "checkpoints"),
    )
    start_step = checkpoints.restore_latest()
    log = MetricsLog(os.path.join(write_dir, "metrics.jsonl"), resume_step=start_step)
    scalars = Scalars(os.path.join(write_dir, "tensorboard"))
    record = run_record(config, placement, cluster, policy, policy_reason, parts.loss_scale, start_step, steps)
    record["input_share"] = job.input_share(cluster)
    record.update({"data": job.data_figures} if job.data_figures else {})  # what a task says of its data
    record["memory"] = run_estimate(job.model, parts.optimizer, parts.weight_average)
    log.write({**record, **(choice.run_fields() if choice is not None else {"precision_choice": None})})
    if not start_step:
        scalars.hyperparameters(config, policy)
    announce(config, placement, cluster, policy, policy_reason, parts.loss_scale, start_step, steps, steps_per_epoch)
    loop = _Loop(
        job,
        config,
        parts,
        checkpoints,
        log,
        scalars,
        steps,
        eval_every=config.train.eval_every or steps_per_epoch,
        utilisation=Utilisation.for_run(job.model, policy, placement.strategy),
        profiler=StepProfiler.from_config(config.runtime, os.path.join(write_dir, "tensorboard")),  # None: off
        histograms=Histograms.from_config(config.train, job, parts.trainer, scalars),  # None: off
    )
    with sigterm_flag() as loop.terminated:
        try:
            loop.run(start_step)
            # The chief may still be writing the best checkpoint that every worker reads next.
            distribute.barrier(placement.strategy)
            metrics = final_test(job, parts.trainer, checkpoints, log, scalars, loop.terminated)
        finally:
            scalars.close()
    who = f"{cluster.name()}: " if cluster.is_multi_worker else ""
    step = int(parts.trainer.step.numpy())
    logger.info(f"{who}final weights {weights_fingerprint(job.model)} (step {step})", extra=EVERY_WORKER)
    return metrics


def _build_parts(job, config, strategy, policy, steps):
    """The training parts of a job whose model the probe did not train (`build_training`)."""
    learning_rates, optimizer = job.learning_rates, job.optimizer
    return build_training(
        job.model, job.loss_fn, config, strategy, policy, steps, learning_rates=learning_rates, optimizer=optimizer
    )


class _Loop:
    def __init__(
        self, job, config, parts, checkpoints, log, scalars, steps, eval_every, utilisation, profiler, histograms
    ):
        self.job, self.config, self.trainer = job, config, parts.trainer
        self.checkpoints, self.log, self.scalars = checkpoints, log, scalars
        self.steps, self.eval_every = steps, eval_every
        self.lr_factor = parts.learning_rate_factor
        self.utilisation, self.profiler, self.histograms = utilisation, profiler, histograms
        self.watch = NumericsWatch(self.trainer, log, config)
        self.terminated = threading.Event()  # replaced by run_training with the SIGTERM flag (engine/signals.py)
        self.spe = config.runtime.steps_per_execution
        t = config.train
        # a graph call never crosses one of these
        self.intervals = (t.log_every, eval_every, t.checkpoint_every) + (
            (t.histogram_every,) if t.histogram_every else ()
        )
        self.restores = 0
        self.callbacks = job.callbacks
        self.epoch_loss = [0.0, 0]  # the training loss's sum and steps since the interval began

    def run(self, start_step):
        """Trains from `start_step` to the end or an early stop, telling callbacks (unless interrupted)."""
        if self.callbacks is not None:
            epochs = -(-self.steps // self.eval_every)
            self.callbacks.train_begin(self.job.model, self.trainer.optimizer, epochs, self.eval_every)
        self._run(start_step)
        if self.callbacks is not None:
            self.callbacks.train_end({})

    def _run(self, start_step):
        step = start_step
        try:
            due = self.job.has_dev and step and (step % self.eval_every == 0 or step == self.steps)
            if due and evaluation_missed(self.checkpoints.source, step) and self._evaluate_and_checkpoint(step):
                return
            if step >= self.steps or self._stopped_early() or stopped_by_callback(self.log.path, step):
                return
            if not step and self.config.train.eval_on_start:
                self._evaluate_on_start()
            if self.config.train.on_nonfinite == "restore" and self.checkpoints.restored_path is None:
                self.checkpoints.save()  # something to go back to before the first interval
            while step < self.steps:
                step = self._train_from(step)
        except (KeyboardInterrupt, Interrupted):
            if self.checkpoints.saved_step() != int(self.trainer.step.numpy()):
                self.checkpoints.save()
            logger.info(
                f"interrupted: saved a checkpoint at step {int(self.trainer.step.numpy())}; "
                "rerun the same command to resume"
            )
            raise
        finally:
            if self.profiler:  # a run that ended (or stopped) inside the range
                self.profiler.stop(int(self.trainer.step.numpy()))

    def _train_from(self, step):
        """Trains from `step` until the end, an early stop, or a restore; returns the step reached."""
        # Step N is batches N*K .. N*K+K-1 of the plan (K = accumulation_steps).
        first_batch = step * self.config.train.accumulation_steps
        iterator = iter(
            distribute.distribute_batches(
                self.trainer.strategy,
                lambda *share: self.job.train_dataset(first_batch, *share),
                sharded=self.job.builds_shares,
            )
        )
        progress = Progress(self.steps, step)
        window = Window()
        try:
            while step < self.steps:
                n = self._chunk(step)
                if self.callbacks is not None and step % self.eval_every == 0:
                    self.callbacks.epoch_begin(step // self.eval_every)
                if self.profiler:
                    self.profiler.before_call(step, n)
                totals = self.trainer.train(iterator, n)
                if step == 0:  # the first call of a fresh run: its graph for TensorBoard
                    self.scalars.graph(self.trainer.train_graph(iterator, n))
                previous, step = step, int(self.trainer.step.numpy())
                if self.profiler:
                    self.profiler.after_call(step)
                window.add(totals, step - previous)
                self.epoch_loss = [
                    self.epoch_loss[0] + window.last_loss * (step - previous),
                    self.epoch_loss[1] + step - previous,
                ]
                if self.callbacks is not None:
                    self.callbacks.batch_end((step - 1) % self.eval_every, {"loss": window.last_loss})
                if self.terminated.is_set():
                    raise Interrupted("SIGTERM")
                stopped = int(totals["stop"]) != RUNNING
                if stopped or int(totals["overflow_steps"]):
                    progress.clear()  # log lines follow
                self.watch.after_call(totals, step)
                if stopped:
                    self._log_train(step, window)
                    return self._cannot_go_on(totals, step)
                mfu = self.utilisation.mfu(window)
                progress.update(step, window.last_loss, window.tokens_per_second(), self._scale_note(), mfu)
                if step % self.config.train.log_every == 0 or step == self.steps:
                    progress.clear()
                    self._log_train(step, window)
                    self.utilisation.remeasure_if_due()  # between windows: never beside a timed step
                    window = Window()
                if self.histograms and self.histograms.due(step):
                    self.histograms.write(step)
                if self._end_of_interval(step) and self._evaluate_and_checkpoint(step):
                    return self.steps
                if self.terminated.is_set():  # during the evaluation: its checkpoint is saved
                    raise Interrupted("SIGTERM")
        finally:
            progress.clear()
        return step

    def _cannot_go_on(self, totals, step):
        """A graph call stopped early: restore the last good checkpoint if the NaN policy
        allows one more, else stop with a diagnosis. Returns the step to train from."""
        t = self.config.train
        if int(totals["stop"]) == NONFINITE_LOSS and t.on_nonfinite == "restore" and self.restores < t.max_restores:
            return self._restore(step)
        raise NumericsError(self.watch.diagnosis(totals["stop"], step, self.config, self.checkpoints.latest_path()))

    def _restore(self, bad_step):
        step = self.checkpoints.restore_latest()
        path = self.checkpoints.restored_path
        self.restores += 1
        # The checkpoint brought back its own factor; lower it from there (not the rate
        # of a user's optimizer: amptrain does not own it).
        factor = None
        if self.lr_factor is not None:
            factor = float(self.lr_factor.numpy()) * self.config.train.restore_lr_factor
            self.lr_factor.assign(factor)
        self.log.rewind(step)
        self.log.write(
            {
                "kind": "restore",
                "step": step,
                "from_step": bad_step,
                "checkpoint": path,
                "learning_rate_factor": factor,
                "restores": self.restores,
            }
        )
        rate = f"learning rate x{factor:g} from here" if factor is not None else "your optimizer's rate unchanged"
        logger.info(
            f"non-finite loss at step {bad_step}: restored the checkpoint of step {step} ({path}), {rate} "
            f"(restore {self.restores} of {self.config.train.max_restores}); the steps "
            "after it are trained again and their records replaced"
        )
        self.watch.note_scale(step)
        return step

    def _scale_note(self):
        scaler = self.trainer.loss_scale
        if scaler is None:
            return ""
        return f"scale {scaler.scale.numpy():g}  skipped {int(self.trainer.skipped_steps.numpy())}"

    def _chunk(self, step):
        """Steps in the next graph call: up to steps_per_execution, never past a boundary."""
        n = min(self.spe, self.steps - step)
        for every in self.intervals:
            n = min(n, every - step % every)
        return n

    def _end_of_interval(self, step):
        return step == self.steps or step % self.eval_every == 0 or step % self.config.train.checkpoint_every == 0

    def _stopped_early(self):
        patience = self.config.train.patience
        return patience > 0 and int(self.checkpoints.evals_since_best.numpy()) >= patience

    def _log_train(self, step, window):
        scale = self.trainer.loss_scale
        record = {
            "kind": "train",
            "step": step,
            "loss": window.mean_loss(),
            "learning_rate": current_learning_rate(self.trainer.optimizer),
            "loss_scale": float(scale.scale.numpy()) if scale is not None else None,
            "skipped_steps": int(self.trainer.skipped_steps.numpy()),
            "consecutive_skips": int(self.trainer.consecutive_skips.numpy()),
            "overflows": window.overflow_steps,
            "grad_norm": window.grad_norm,
            "tokens_per_second": window.tokens_per_second(),
            "padded_tokens_per_second": window.tokens_per_second(padded=True),
            **window.token_figures(),
            **self.utilisation.figures(window),
            "wall_time": time.time(),
        }
        self.log.write(record)
        self.scalars.write("train", step, {k: v for k, v in record.items() if k not in ("kind", "step", "wall_time")})
        skipped = f"  skipped {record['skipped_steps']}" if record["skipped_steps"] else ""
        logger.info(
            f"step {step}/{self.steps}  loss {record['loss']:.4f}  lr {record['learning_rate']:.2e}  "
            f"{record['tokens_per_second']:,.0f} tokens/s"
            + (f"  MFU {record['mfu']:.1%}" if record["mfu"] is not None else "")
            + (f"  loss scale {record['loss_scale']:g}" if scale is not None else "")
            + skipped
        )

    def _evaluate_and_checkpoint(self, step):
        """Evaluates on dev when due, checkpoints, keeps the best; returns True to stop early.

        With a weight average the dev split is scored with the averaged weights, and the
        best checkpoint holds them as the model's weights (so the final test, `evaluate` and
        `predict` use what dev scored); the step checkpoints hold the trained weights (and
        the average's sums), which is what a resume needs."""
        stop = False
        improved = False
        average = self.trainer.weight_average
        with average.applied() if average is not None else contextlib.nullcontext():
            if self.job.has_dev and (step % self.eval_every == 0 or step == self.steps):
                if step == self.steps:  # no step follows: the evaluation (a generation) takes its memory
                    self.trainer.release_training()
                metrics = self.job.evaluate("dev", self.job.model, self.trainer.predict, None, quick=True)
                # best_metric holds the value with its sign turned so that higher is better.
                value = metrics[self.job.primary_metric] * (1 if self.job.higher_is_better else -1)
                improved = value > self.checkpoints.best_metric.numpy()
                if improved:
                    self.checkpoints.best_metric.assign(value)
                    self.checkpoints.best_step.assign(step)
                    self.checkpoints.evals_since_best.assign(0)
                else:
                    self.checkpoints.evals_since_best.assign_add(1)
                self._log_eval(step, "dev", "average" if average is not None else "latest", metrics)
                stop = self._stopped_early()
                if stop:
                    logger.info(
                        f"early stop: no better dev {self.job.primary_metric} "
                        f"in {self.config.train.patience} evaluations"
                    )
            if improved or not self.job.has_dev and step == self.steps:
                self.checkpoints.save_best()
                self._project()
            if self.callbacks is not None and (step % self.eval_every == 0 or step == self.steps):
                stop = self._epoch_end(step, metrics if self.job.has_dev else {}) or stop
        self.checkpoints.save()
        return stop

    def _evaluate_on_start(self):
        """`train.eval_on_start`: dev and test scored before the first step (the start's scores
        beside the trained one's); dev's counts: a run that never beats its start keeps it."""
        if self.job.has_dev:
            metrics = self.job.evaluate("dev", self.job.model, self.trainer.predict, None, quick=True)
            value = metrics[self.job.primary_metric] * (1 if self.job.higher_is_better else -1)
            self.checkpoints.best_metric.assign(value)
            self.checkpoints.best_step.assign(0)
            self._log_eval(0, "dev", "start", metrics)
            self.checkpoints.save_best()
        if self.job.has_test:
            metrics = self.job.evaluate("test", self.job.model, self.trainer.predict, None)
            self._log_eval(0, "test", "start", metrics)

    def _project(self):
        """The best checkpoint's token embeddings for TensorBoard's projector (`projector.py`)."""
        rows = self.config.train.projector_rows
        if self.job.projections is None or not rows:
            return
        train_run = os.path.join(os.path.dirname(self.checkpoints.directory), "tensorboard", "train")
        write_projector(train_run, self.job.projections(self.job.model), rows)

    def _epoch_end(self, step, dev_metrics):
        """Tells the callbacks an interval ended, with its logs as Keras names them (`loss`,
        `val_loss`, `val_<metric>`), and records them; True when a callback stops the run
        (`model.stop_training`): then an `epoch` record says so, and a resume ends too."""
        total, steps = self.epoch_loss
        logs = {"loss": total / steps} if steps else {}
        logs.update({f"val_{k}": v for k, v in dev_metrics.items() if isinstance(v, float)})
        epoch = -(-step // self.eval_every) - 1
        stop = bool(self.callbacks.epoch_end(epoch, logs))
        self.log.write({"kind": "epoch", "step": step, "epoch": epoch, "logs": logs, "stop_training": stop})
        self.epoch_loss = [0.0, 0]
        if stop:
            logger.info(f"stopped by a callback after epoch {epoch + 1} (step {step})")
        return stop

    def _log_eval(self, step, split, checkpoint, metrics):
        write_eval(self.log, self.scalars, step, split, checkpoint, metrics)
