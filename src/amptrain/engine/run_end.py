"""How a run ends: the test split scored with the best checkpoint, a finished run left as
it is, a stop a callback asked for, and the weights' fingerprint that workers print.

    metrics = final_test(job, trainer, checkpoints, log, scalars, terminated)
    finished(run_dir, metrics_path, steps)   # a finished run: its test record, not trained again
"""

import hashlib
import logging
import os

import numpy as np

from amptrain.engine.run_log import LOGGER_NAME, read_metrics
from amptrain.errors import ConfigError, Interrupted

logger = logging.getLogger(LOGGER_NAME)


def weights_fingerprint(model):
    """A short hash of the model's weights: workers that trained in sync print the same."""
    import tensorflow as tf

    digest = hashlib.sha256()
    for variable in model.weights:
        # A slice at a time: `numpy()` copies what it reads, and the whole of a pretrained
        # LM's 113 MB embedding, copied after its test's generation, was the run's peak.
        flat = tf.reshape(variable, [-1])
        for start in range(0, int(flat.shape[0]), _HASHED_ELEMENTS):
            digest.update(np.ascontiguousarray(flat[start : start + _HASHED_ELEMENTS].numpy()).view(np.uint8))
    return digest.hexdigest()[:16]


_HASHED_ELEMENTS = 1 << 20  # a weight's elements hashed at once


def write_eval(log, scalars, step, split, checkpoint, metrics):
    log.write({"kind": "eval", "step": step, "split": split, "checkpoint": checkpoint, **metrics})
    scalars.write(split, step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
    logger.info(f"eval {split} at step {step} ({checkpoint}): {shown}")


def final_test(job, trainer, checkpoints, log, scalars, terminated):
    """Scores the test split with the best checkpoint and marks the run finished, unless a
    SIGTERM came meanwhile: then there is no `end` record, and a rerun scores it again."""
    last_step = int(checkpoints.step.numpy())
    metrics = {}
    if job.has_test:
        trainer.release_training()  # no more steps: the test's evaluation and generation take its memory
        path = checkpoints.restore_best()
        best_step = int(checkpoints.step.numpy())
        predictions = os.path.join(os.path.dirname(checkpoints.directory), "predictions-test")
        metrics = job.evaluate("test", job.model, trainer.predict, predictions)
        write_eval(log, scalars, best_step, "test", os.path.basename(path), metrics)
    if terminated.is_set():
        logger.info("interrupted during the final test: rerun the same command to score it again")
        raise Interrupted("SIGTERM")
    log.write({"kind": "end", "step": last_step})
    return metrics


def finished(run_dir, metrics_path, steps):
    """A finished run is not trained again: its test record. One that now asks for more steps
    is refused, saying why: its learning-rate schedule ran to its end, and the test was
    scored; going on would need a new schedule, which is a new run."""
    records = read_metrics(metrics_path)
    planned = next((r["total_steps"] for r in reversed(records) if r.get("kind") == "run"), None)
    if planned is not None and steps > planned:
        raise ConfigError(
            f"{run_dir}: this run finished its {planned} steps (its learning rate decayed to the end and the "
            f"test was scored); it is not continued to {steps}. Train a new run: --run-dir NEW, or --overwrite"
        )
    logger.info(f"{run_dir}: this run has finished; nothing to do (use --overwrite to start afresh)")
    return _final_test_record(metrics_path)


def stopped_by_callback(metrics_path, step):
    """A callback stopped this run at `step` (its last `epoch` record says so)."""
    epochs = [r for r in read_metrics(metrics_path) if r.get("kind") == "epoch" and r.get("step") == step]
    return bool(epochs) and bool(epochs[-1].get("stop_training"))


def _final_test_record(metrics_path):
    tests = [r for r in read_metrics(metrics_path) if r.get("kind") == "eval" and r.get("split") == "test"]
    return tests[-1] if tests else {}
