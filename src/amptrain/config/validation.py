"""The checks on a built config: impossible values stop the run before any work, with a
message naming the key, what was expected and what was received."""

import glob
import math
import os

from amptrain import xla_modes
from amptrain.config.sections import (
    CLUSTER_SOURCES,
    CONCRETE_POLICIES,
    LOSS_SCALES,
    ON_NONFINITE,
    POLICIES,
    STRATEGIES,
    path_keys,
)
from amptrain.errors import ConfigError


def require(ok, key, expected, value):
    """Refuses `value` of `key` unless `ok`, saying what was expected (a task's own checks use it too)."""
    if not ok:
        raise ConfigError(f"{key}: expected {expected}, received {value!r}")


def validate(config, task_class, check_files=True):
    """Refuses impossible values, naming the key, what is expected and what was received:
    the keys every task has here, then the task's own (`task_class.check_config`).
    `check_files=False`: a run folder's saved config, whose data files predict and export
    do not need (the folder may have moved to another machine)."""
    d, m, p, r, t = config.data, config.model, config.precision, config.runtime, config.train
    corpora = getattr(task_class, "reads_corpora", False)
    for name in path_keys(d):
        key, path = f"data.{name}", getattr(d, name)
        if corpora and key in ("data.train", "data.dev", "data.test"):
            found = not path or not check_files or os.path.isfile(path) or os.path.isdir(path) or glob.glob(path)
            require(bool(found), key, "an existing file, folder, or a glob that matches files", path)
            continue
        require(not path or not check_files or os.path.isfile(path), key, "an existing file", path)
    require(d.vocabulary_size >= 16, "data.vocabulary_size", "an integer >= 16", d.vocabulary_size)
    require(d.max_length >= 2, "data.max_length", "an integer >= 2", d.max_length)
    require(d.num_buckets >= 1, "data.num_buckets", "an integer >= 1", d.num_buckets)
    require(
        d.tokens_per_batch >= 0,
        "data.tokens_per_batch",
        "an integer >= 0 (0: train.batch_size rows)",
        d.tokens_per_batch,
    )
    require(
        d.tokens_per_batch == 0 or d.tokens_per_batch >= round_up8(d.max_length),
        "data.tokens_per_batch",
        f"0 or at least data.max_length rounded up to a multiple of 8 ({round_up8(d.max_length)}), "
        "so the longest batch holds a row",
        d.tokens_per_batch,
    )
    for key in ("num_layers", "hidden_dim", "num_heads", "intermediate_dim"):
        value = getattr(m, key)
        require(value >= 1, f"model.{key}", "a positive integer", value)
    require(
        m.hidden_dim % m.num_heads == 0,
        "model.num_heads",
        f"a divisor of model.hidden_dim ({m.hidden_dim})",
        m.num_heads,
    )
    require(0.0 <= m.dropout < 1.0, "model.dropout", "a number in [0, 1)", m.dropout)
    require(m.remat in ("none", "blocks"), "model.remat", '"none" or "blocks"', m.remat)
    require(
        not (m.pretrained and m.remat != "none") or getattr(task_class, "recomputes_pretrained", False),
        "model.remat",
        "\"none\" with model.pretrained here (a pretrained encoder's blocks are keras-hub's, which recompute nothing)",
        m.remat,
    )
    require(p.policy in POLICIES, "precision.policy", f"one of {POLICIES}", p.policy)
    require(
        bool(p.allow) and all(a in CONCRETE_POLICIES for a in p.allow) and len(set(p.allow)) == len(p.allow),
        "precision.allow",
        f"a list of distinct policies from {CONCRETE_POLICIES}",
        p.allow,
    )
    require(
        p.policy == "auto" or p.policy in p.allow,
        "precision.policy",
        f'a policy that precision.allow lists ({", ".join(p.allow)}) or "auto"',
        p.policy,
    )
    require(
        r.jit_compile in (*xla_modes.MODES, "auto"),
        "runtime.jit_compile",
        'true, false, "fusible" or "auto"',
        r.jit_compile,
    )
    _validate_loss_scale(p)
    require(r.strategy in STRATEGIES, "runtime.strategy", f"one of {STRATEGIES}", r.strategy)
    require(r.cluster in CLUSTER_SOURCES, "runtime.cluster", f"one of {CLUSTER_SOURCES}", r.cluster)
    require(
        r.cpu_replicas >= 0, "runtime.cpu_replicas", "an integer >= 0 (0 or 1: the CPU as one device)", r.cpu_replicas
    )
    require(
        0 < r.collective_timeout < math.inf,
        "runtime.collective_timeout",
        "a finite number of seconds > 0",
        r.collective_timeout,
    )
    require(
        0 < r.startup_timeout < math.inf,
        "runtime.startup_timeout",
        "a finite number of seconds > 0",
        r.startup_timeout,
    )
    require(r.steps_per_execution >= 1, "runtime.steps_per_execution", "an integer >= 1", r.steps_per_execution)
    require(
        r.profile_steps == []
        or len(r.profile_steps) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) for s in r.profile_steps)
        and 1 <= r.profile_steps[0] <= r.profile_steps[1],
        "runtime.profile_steps",
        "[] (off) or [first, last], integers with 1 <= first <= last",
        r.profile_steps,
    )
    require(t.steps is None or t.steps >= 1, "train.steps", "an integer >= 1", t.steps)
    require(t.epochs >= 1, "train.epochs", "an integer >= 1", t.epochs)
    require(t.batch_size >= 1, "train.batch_size", "an integer >= 1", t.batch_size)
    require(t.optimizer in ("adam", "adamw"), "train.optimizer", "adam or adamw", t.optimizer)
    require(0 < t.learning_rate < math.inf, "train.learning_rate", "a finite number > 0", t.learning_rate)
    require(t.weight_decay >= 0, "train.weight_decay", "a number >= 0", t.weight_decay)
    require(t.warmup_steps >= 0, "train.warmup_steps", "an integer >= 0", t.warmup_steps)
    require(t.decay in ("cosine", "linear", "constant"), "train.decay", "cosine, linear or constant", t.decay)
    require(t.clip_norm >= 0, "train.clip_norm", "a number >= 0 (0: no clipping)", t.clip_norm)
    for key in ("log_every", "checkpoint_every", "max_to_keep"):
        value = getattr(t, key)
        require(value >= 1, f"train.{key}", "an integer >= 1", value)
    require(t.histogram_every >= 0, "train.histogram_every", "an integer >= 0 (0: no histograms)", t.histogram_every)
    require(t.projector_rows >= 0, "train.projector_rows", "an integer >= 0 (0: no projector)", t.projector_rows)
    require(t.eval_every >= 0, "train.eval_every", "an integer >= 0 (0: once an epoch)", t.eval_every)
    require(t.patience >= 0, "train.patience", "an integer >= 0 (0: no early stopping)", t.patience)
    require(t.on_nonfinite in ON_NONFINITE, "train.on_nonfinite", " | ".join(ON_NONFINITE), t.on_nonfinite)
    require(0 < t.restore_lr_factor <= 1, "train.restore_lr_factor", "a number in (0, 1]", t.restore_lr_factor)
    require(t.max_restores >= 1, "train.max_restores", "an integer >= 1", t.max_restores)
    require(t.accumulation_steps >= 1, "train.accumulation_steps", "an integer >= 1", t.accumulation_steps)
    require(0.0 <= t.ema_decay < 1.0, "train.ema_decay", "a number in [0, 1) (0: no weight average)", t.ema_decay)
    require(
        0 <= t.head_learning_rate < math.inf,
        "train.head_learning_rate",
        "a finite number >= 0 (0: train.learning_rate)",
        t.head_learning_rate,
    )
    require(0 < t.layer_decay <= 1, "train.layer_decay", "a number in (0, 1] (1: no decay)", t.layer_decay)
    if not m.pretrained:
        require(
            t.head_learning_rate == 0,
            "train.head_learning_rate",
            "0 (a head's own rate needs model.pretrained)",
            t.head_learning_rate,
        )
        require(t.layer_decay == 1, "train.layer_decay", "1 (layer-wise decay needs model.pretrained)", t.layer_decay)
    task_class.check_config(config)


def round_up8(value):
    return -(-int(value) // 8) * 8


def _validate_loss_scale(p):
    """The scaler's settings; NaN fails every comparison, so it is refused too."""

    def finite_positive(value):
        return 0 < value < math.inf

    scale = p.loss_scale
    if isinstance(scale, str):
        require(scale in LOSS_SCALES, "precision.loss_scale", f"{' | '.join(LOSS_SCALES)} or a number > 0", scale)
    else:
        require(finite_positive(scale), "precision.loss_scale", "a finite number > 0 (a fixed scale)", scale)
    require(finite_positive(p.initial_scale), "precision.initial_scale", "a finite number > 0", p.initial_scale)
    require(p.growth_interval >= 1, "precision.growth_interval", "an integer >= 1", p.growth_interval)
    require(1 < p.growth_factor < math.inf, "precision.growth_factor", "a finite number > 1", p.growth_factor)
    require(0 < p.backoff_factor < 1, "precision.backoff_factor", "a number in (0, 1)", p.backoff_factor)
    require(p.hysteresis >= 1, "precision.hysteresis", "an integer >= 1", p.hysteresis)
    require(finite_positive(p.min_scale), "precision.min_scale", "a finite number > 0", p.min_scale)
    require(finite_positive(p.max_scale), "precision.max_scale", "a finite number > 0", p.max_scale)
    require(
        p.min_scale <= p.max_scale, "precision.min_scale", f"at most precision.max_scale ({p.max_scale:g})", p.min_scale
    )
    require(p.max_consecutive_skips >= 1, "precision.max_consecutive_skips", "an integer >= 1", p.max_consecutive_skips)
