"""What a run tells: `metrics.jsonl` (its `run` record among them), TensorBoard scalars,
`train.log` (the lines that announce the run) and the progress line.

log = MetricsLog("runs/x/metrics.jsonl", resume_step=0)
log.write({"kind": "train", "step": 25, "loss": 0.41})
"""

import json
import logging
import math
import os
import sys
import time

from amptrain.files import atomic_write

LOGGER_NAME = "amptrain"
logger = logging.getLogger(LOGGER_NAME)


EVERY_WORKER = {"every_worker": True}  # `extra=` of a line that every worker shows on its terminal


def setup_logging(run_dir, quiet_console=False):
    """Everything logged goes to `run_dir/train.log` and the terminal; with `quiet_console`
    (a worker other than the chief) the terminal only gets warnings and lines logged with
    `extra=EVERY_WORKER`."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    try:
        file_handler = logging.FileHandler(os.path.join(run_dir, "train.log"), encoding="utf-8")
    except OSError as error:
        from amptrain.errors import UserError

        raise UserError(f"{run_dir}: cannot write train.log there ({error.strerror})") from None
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(message)s"))
    if quiet_console:
        console.addFilter(lambda record: record.levelno >= logging.WARNING or getattr(record, "every_worker", False))
    logger.addHandler(file_handler)
    logger.addHandler(console)
    logger.propagate = False
    return logger


def _json_value(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


class MetricsLog:
    """One JSON object a line. On resume, records of steps after `resume_step` (written
    by the interrupted run after its last checkpoint) and any test score (made again at
    the end) are dropped, so no step appears twice."""

    def __init__(self, path, resume_step=None):
        self.path = path
        if resume_step is not None:
            self.rewind(resume_step)

    def rewind(self, step):
        """Drops the records of steps after `step` (and test scores): they are made again."""
        if os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if _kept_on_resume(r, step)]
            atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record):
        record = {key: _json_value(value) for key, value in record.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _kept_on_resume(record, resume_step):
    if record.get("kind") == "run":
        return True
    return record.get("step", 0) <= resume_step and record.get("split") != "test"


def read_metrics(path):
    """The records of `path`. A line that is not JSON (the half-written last line a full disk
    or a kill leaves) is reported and skipped: the records before it are intact."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning(f"{path}:{number}: not a whole JSON record (a write cut short?); skipped")
    return records


def run_record(config, placement, cluster, policy, policy_reason, scaler, start_step, steps):
    """The `run` record of metrics.jsonl: how this (part of the) run trains."""
    t = config.train
    return {
        "kind": "run",
        **placement.describe(cluster),
        "global_batch_size": None if config.data.tokens_per_batch else t.batch_size,
        "tokens_per_batch": config.data.tokens_per_batch or None,
        "accumulation_steps": t.accumulation_steps,
        "policy": policy,
        "policy_reason": policy_reason,
        "jit_compile": config.runtime.jit_compile,
        "steps_per_execution": config.runtime.steps_per_execution,
        "loss_scale": scaler.describe() if scaler is not None else None,
        "on_nonfinite": t.on_nonfinite,
        "ema_decay": t.ema_decay,
        "resumed_from_step": start_step,
        "total_steps": steps,
    }


def announce(config, placement, cluster, policy, policy_reason, scaler, start_step, steps, steps_per_epoch):
    """The log lines that say how the run trains: strategy, batches, precision, length."""
    t = config.train
    if start_step:
        logger.info(f"resuming from the checkpoint of step {start_step}")
    replicas = placement.strategy.num_replicas_in_sync
    tokens = config.data.tokens_per_batch
    logger.info(
        f"strategy {placement.name} ({placement.why}): {replicas} replica(s) on {cluster.num_workers} worker(s); "
        + (
            f"global batches of {tokens} padded tokens (rows by length, split over the replicas)"
            if tokens
            else f"global batch {t.batch_size} ({t.batch_size // replicas} a replica)"
        )
        + (f" x {t.accumulation_steps} micro-batches a step" if t.accumulation_steps > 1 else "")
    )
    logger.info(f"policy {policy} ({policy_reason}); {steps} steps, {steps_per_epoch} a epoch")
    if scaler is not None:
        logger.info(scaler.describe())


# TensorBoard groups a run's scalars by the part of their tag before "/", in alphabetical
# order: the task's scores first, under `metrics/` (a chart draws the train, dev and test
# runs together), then the optimizer, what the precision did, the data's size, memory
# (`system/`) and speed.
TAG_GROUPS = {
    "optimizer": ("learning_rate", "grad_norm"),
    "precision": ("loss_scale", "skipped_steps", "consecutive_skips", "overflows"),
    "size": ("examples", "sentences", "bytes", "tokens"),
    "system": ("memory_bytes", "peak_memory_bytes"),
    "throughput": ("tokens_per_second", "padded_tokens_per_second", "mfu", "tokens_per_step", "real_over_padded"),
}
_GROUP_OF = {name: group for group, names in TAG_GROUPS.items() for name in names}


def scalar_tag(name):
    """The TensorBoard tag of a record's field: "precision/loss_scale", "metrics/loss", ..."""
    return f"{_GROUP_OF.get(name, 'metrics')}/{name}"


class Scalars:
    """TensorBoard scalars under `run_dir/tensorboard/{train,<split>}`, tagged by group
    (`scalar_tag`); the run's hyperparameters (the hparams plugin) with the `train` ones."""

    def __init__(self, directory):
        self.directory = directory
        self._writers = {}

    def writer(self, group):
        """The summary writer of `group` (histograms write with it too)."""
        import tensorflow as tf

        if group not in self._writers:
            self._writers[group] = tf.summary.create_file_writer(os.path.join(self.directory, group))
        return self._writers[group]

    def write(self, group, step, values):
        import tensorflow as tf

        with self.writer(group).as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and value is not None and not isinstance(value, bool):
                    tf.summary.scalar(scalar_tag(name), value)
        self._writers[group].flush()

    def graph(self, graph):
        """The training call's graph (TensorBoard's Graphs tab), once a run."""
        import tensorflow as tf

        with self.writer("train").as_default():
            tf.summary.graph(graph)
        self._writers["train"].flush()

    def hyperparameters(self, config, policy):
        """The config's keys (lists as text) and the policy the run trains with, once a run."""
        from tensorboard.plugins.hparams import api as hp

        from amptrain.config import to_dict

        values = {"task": config.task, "policy": policy}
        for section, keys in to_dict(config).items():
            for key, value in keys.items() if isinstance(keys, dict) else ():
                if value is not None:
                    values[f"{section}.{key}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
        with self.writer("train").as_default():
            hp.hparams(values)
        self._writers["train"].flush()

    def close(self):
        for writer in self._writers.values():
            writer.close()


class Pace:
    """Elapsed time and an estimate of the time left for `total` units of work (steps,
    batches, bench rows), from the pace since the first update: the first unit carries
    the tracing and compiling, which the rest do not repeat.

        pace = Pace(total=200, done=0)
        ...; pace.describe(done=50)    # "0:40 elapsed, 1:30 left"
    """

    def __init__(self, total, done=0):
        self.total = total
        self.started = time.monotonic()
        self._first = None  # (time, done) of the first update

    def left(self, done):
        """Seconds left (NaN before any pace is known)."""
        now = time.monotonic()
        if self._first is None and done > 0:
            self._first = (now, done)
            base, base_done = self.started, 0
        else:
            base, base_done = self._first if self._first and done > self._first[1] else (self.started, 0)
        if done <= base_done:
            return float("nan")
        return (now - base) / (done - base_done) * max(self.total - done, 0)

    def elapsed(self):
        return time.monotonic() - self.started

    def describe(self, done):
        left = self.left(done)
        return f"{format_duration(self.elapsed())} elapsed, {format_duration(left)} left"


class Progress:
    """A progress line redrawn in place on a terminal (nothing elsewhere): `unit done/total`,
    the details, the elapsed time and the time left; drawn once `after` seconds have passed.

        progress = Progress(total_steps=200, start_step=0)
        progress.update(step, loss, tokens_per_second, note, mfu)   # fit's line
        progress.show(done, "details")                             # anything else's
        progress.clear()
    """

    def __init__(self, total_steps, start_step, stream=None, unit="step", after=0.0):
        self.total_steps = total_steps
        self.start_step = start_step
        self.unit = unit
        self.after = after
        self.pace = Pace(total_steps - start_step)
        # sys.stderr as it is now: a default bound at import would keep a stream replaced
        # since (pytest's capture, closed after the test that first imported this module).
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = self.stream.isatty()
        self._drawn = False

    def update(self, step, loss, tokens_per_second, note="", mfu=None):
        self.show(
            step,
            f"loss {loss:.4f}  {tokens_per_second:,.0f} tokens/s  {f'MFU {mfu:.1%}  ' if mfu is not None else ''}"
            f"{note}",
        )

    def line(self, done, details=""):
        total = f"/{self.total_steps}" if self.total_steps else ""
        time_text = (
            self.pace.describe(done - self.start_step)
            if self.total_steps
            else format_duration(self.pace.elapsed()) + " elapsed"
        )
        return f"{self.unit} {done}{total}  {details.strip() + '  ' if details.strip() else ''}{time_text}"

    def show(self, done, details=""):
        line = self.line(done, details)  # also when not drawn: the pace needs every update
        if not self.interactive or self.pace.elapsed() < self.after:
            return
        self.stream.write("\r" + line.ljust(100))
        self.stream.flush()
        self._drawn = True

    def clear(self):
        if self.interactive and self._drawn:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()
            self._drawn = False


def format_duration(seconds):
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


class Window:
    """Totals of the steps since the last `train` record."""

    def __init__(self):
        self.started = time.time()
        self.loss_total = 0.0
        self.applied_steps = 0
        self.overflow_steps = 0
        self.steps = 0
        self.tokens = [0, 0]
        self.examples = 0
        self.grad_norm = None
        self.last_loss = float("nan")

    def add(self, totals, n):
        self.loss_total += float(totals["loss_total"])
        self.applied_steps += int(totals["applied_steps"])
        self.overflow_steps += int(totals["overflow_steps"])
        self.steps += n
        self.tokens = [self.tokens[0] + int(totals["tokens"][0]), self.tokens[1] + int(totals["tokens"][1])]
        self.examples += int(totals["examples"])
        if int(totals["applied_steps"]):
            self.grad_norm = float(totals["grad_norm"])
        self.last_loss = self.mean_loss()

    def mean_loss(self):
        """The mean loss of the applied steps (NaN when every step was skipped)."""
        return self.loss_total / self.applied_steps if self.applied_steps else float("nan")

    def token_figures(self):
        """Real tokens a step, and real over padded ones (1.0 for packed blocks: language models)."""
        return {
            "tokens_per_step": self.tokens[0] / max(self.steps, 1),
            "real_over_padded": self.tokens[0] / max(self.tokens[1], 1),
        }

    def tokens_per_second(self, padded=False):
        elapsed = max(time.time() - self.started, 1e-9)
        return self.tokens[1 if padded else 0] / elapsed
