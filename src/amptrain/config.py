"""One frozen configuration tree a run: TOML plus `--set section.key=value` overrides.

    config = load_config("configs/classify-spam.toml", ["train.steps=200"])
    config.train.batch_size  # 32

Unknown keys, wrong types and impossible values stop the run before any work, with
a message naming the key, what was expected and what was received.
"""

import dataclasses
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field

import tomli_w

from amptrain.errors import ConfigError

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "auto")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
TASK_NAMES = ("classification", "ner", "translation")
# The file formats each task reads ("auto": from the file's extension).
TASK_FORMATS = {
    "classification": ("auto", "csv", "tsv", "jsonl"),
    "ner": ("auto", "conll"),
    # tsv: `source<TAB>target` a line; parallel: data.train (source) and data.train_target
    # (target), aligned line by line; auto: parallel when data.train_target is set
    "translation": ("auto", "tsv", "parallel"),
}
LOSS_SCALES = ("auto", "dynamic", "none")
ON_NONFINITE = ("stop", "skip", "restore")


@dataclass(frozen=True)
class DataConfig:
    train: str = ""
    dev: str = ""
    test: str = ""
    format: str = "auto"  # csv | tsv | jsonl (classification), conll (ner), tsv | parallel (translation) | auto
    # translation from two aligned files: the target side of each split (data.train is then the source)
    train_target: str = ""
    dev_target: str = ""
    test_target: str = ""
    text_column: str = "text"
    label_column: str = "label"
    vocabulary: str = ""  # a vocab.txt to load; empty: train one on data.train
    vocabulary_size: int = 8000
    lowercase: bool | None = None  # None: the task's default (classification lowercases, ner and translation keep case)
    shared_vocabulary: bool = True  # translation: one vocabulary for both sides (else one a side)
    max_length: int = 128  # pieces a side (translation: the target's start and end pieces included)
    bucketing: bool = True
    num_buckets: int = 6
    # > 0: batches of as many rows as fit this many padded tokens (rows x padded length;
    # translation: of the longer side), a multiple of 8 rows, instead of train.batch_size rows
    tokens_per_batch: int = 0


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 2
    hidden_dim: int = 64
    num_heads: int = 4
    intermediate_dim: int = 128
    dropout: float = 0.1
    num_decoder_layers: int = 0  # translation: 0 means model.num_layers
    tie_embeddings: bool = True  # translation: the output projection is the target embedding


@dataclass(frozen=True)
class DecodeConfig:
    """Translation: how the model writes its output."""

    beam_size: int = 4  # the test split and `predict`; dev evaluation during training is greedy
    length_penalty: float = 0.6  # GNMT's alpha: scores are divided by ((5 + length) / 6) ** alpha
    max_length: int = 0  # output pieces at most; 0 means data.max_length
    dev_sentences: int = 200  # dev pairs decoded (greedy) at each evaluation; 0: all
    batch_size: int = 64  # sentences decoded at once


@dataclass(frozen=True)
class PrecisionConfig:
    policy: str = "auto"
    # "auto": dynamic under mixed_float16, none otherwise; "dynamic"; "none"; or a number (fixed)
    loss_scale: str | float = "auto"
    initial_scale: float = 2.0**15
    growth_interval: int = 2000  # finite steps in a row before the scale grows
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    hysteresis: int = 1  # overflowing steps in a row before the scale backs off
    min_scale: float = 1.0  # backing off never goes below; an overflow here stops the run
    max_scale: float = 2.0**24  # growing never goes above (an initial or fixed scale may)
    max_consecutive_skips: int = 50  # skipped steps in a row that stop the run


@dataclass(frozen=True)
class RuntimeConfig:
    # auto: multi_worker when TF_CONFIG names a cluster, tpu when a TPU is named or
    # attached, mirrored over several GPUs (or runtime.cpu_replicas), else one_device
    strategy: str = "auto"
    devices: str = ""  # comma-separated, e.g. "/gpu:0,/gpu:1"; empty: every GPU (else the CPU)
    cpu_replicas: int = 0  # > 1: split the CPU into this many logical devices (for mirrored)
    tpu: str = ""  # the TPU's name or grpc:// address; "local" for a TPU VM; empty: from TPU_NAME
    collective_timeout: float = 300.0  # seconds a cross-worker all-reduce may wait for a peer
    jit_compile: bool = False
    steps_per_execution: int = 1
    seed: int = 0
    deterministic: bool = False
    check_numerics: bool = False  # tf.debugging.enable_check_numerics; turns XLA off


@dataclass(frozen=True)
class TrainConfig:
    steps: int | None = None  # when given, wins over epochs
    epochs: int = 3
    batch_size: int = 32
    optimizer: str = "adamw"  # adam | adamw
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    decay: str = "cosine"  # cosine | linear | constant
    clip_norm: float = 1.0  # 0 turns clipping off
    outside_weight: float = 1.0  # ner: the loss weight of words tagged O (most words are)
    label_smoothing: float = 0.0  # translation: the probability spread evenly over the vocabulary
    log_every: int = 25
    eval_every: int = 0  # 0: once an epoch
    checkpoint_every: int = 100
    max_to_keep: int = 3
    patience: int = 0  # evaluations without improvement before stopping; 0: never
    on_nonfinite: str = "stop"  # a non-finite loss: stop | skip | restore (the last good checkpoint)
    restore_lr_factor: float = 0.5  # learning rate multiplier after each restore
    max_restores: int = 3
    accumulation_steps: int = 1  # micro-batches of batch_size a step; one update per step
    # > 0: keep an exponential moving average of the weights with this decay; dev and test
    # evaluations (and the best checkpoint) use it. 0: off
    ema_decay: float = 0.0

    def total_steps(self, steps_per_epoch):
        """`steps` when given, else `epochs` passes over the data."""
        return self.steps if self.steps is not None else self.epochs * steps_per_epoch


@dataclass(frozen=True)
class Config:
    task: str = "classification"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "task"}
# Keys that only say how long to train: a rerun may change them and still resume.
RUN_LENGTH_KEYS = ("train.steps", "train.epochs", "train.patience")
# Keys that only say where a run trains: the update does not depend on the replica count,
# so a run may resume on other devices or another number of workers.
PLACEMENT_KEYS = (
    "runtime.strategy",
    "runtime.devices",
    "runtime.cpu_replicas",
    "runtime.tpu",
    "runtime.collective_timeout",
)
PATH_KEYS = (
    "data.train",
    "data.dev",
    "data.test",
    "data.vocabulary",
    "data.train_target",
    "data.dev_target",
    "data.test_target",
)


def load_config(path, overrides=(), base_dir=None):
    """Reads a TOML file, applies `section.key=value` overrides and validates.

    Relative paths in the file and the overrides resolve against `base_dir`
    (default: the directory the command runs in).
    """
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    return config_from_dict(raw, overrides, base_dir=base_dir, source=str(path))


def config_from_dict(raw, overrides=(), base_dir=None, source="config"):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    if isinstance(overrides, dict):
        overrides = [(k, v) for k, v in overrides.items()]
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        section, _, name = key.partition(".")
        if not name:
            if key != "task":
                raise ConfigError(f"--set {key}: expected section.key=value, e.g. train.steps=200")
            raw["task"] = value
            continue
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        raw[section][name] = value
    config = _build(raw, source)
    config = _resolve_paths(config, base_dir or os.getcwd())
    validate(config)
    return config


def parse_override(text):
    """`train.steps=200` -> ("train.steps", 200); a bare word that is no TOML value is a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. train.steps=200")
    value = value.strip()
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def _build(raw, source):
    task = raw.pop("task", Config.task)
    if not isinstance(task, str):
        raise ConfigError(f"{source}: task: expected a string, received {task!r}")
    sections = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise ConfigError(
                f"{source}: unknown section or key {name!r}; expected one of: task, "
                + ", ".join(f"[{s}]" for s in SECTIONS)
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: [{name}] must be a table, received {value!r}")
        sections[name] = _build_section(name, SECTIONS[name], value, source)
    return Config(task=task, **sections)


def _build_section(section, cls, values, source):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"{source}: unknown key {section}.{key}; [{section}] has: {', '.join(fields)}")
        kwargs[key] = _check_type(f"{section}.{key}", fields[key].type, value)
    return cls(**kwargs)


def _check_type(key, annotation, value):
    """Returns `value` if it fits `annotation` (int is accepted for float), else raises."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    bases = [a for a in typing.get_args(annotation) if a is not type(None)] if union else [annotation]
    if value is None and type(None) in typing.get_args(annotation):
        return None
    for base in bases:
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, base) and not (base is int and isinstance(value, bool)):
            return value
    expected = " or ".join(b.__name__ for b in bases)
    raise ConfigError(f"{key}: expected {expected}, received {value!r} ({type(value).__name__})")


def _resolve_paths(config, base_dir):
    data = config.data
    resolved = {}
    for key in PATH_KEYS:
        name = key.split(".")[1]
        value = getattr(data, name)
        if value and not os.path.isabs(value):
            resolved[name] = os.path.normpath(os.path.join(base_dir, value))
    return dataclasses.replace(config, data=dataclasses.replace(data, **resolved))


def validate(config):
    """Refuses impossible values, naming the key, what is expected and what was received."""

    def require(ok, key, expected, value):
        if not ok:
            raise ConfigError(f"{key}: expected {expected}, received {value!r}")

    d, m, p, r, t = config.data, config.model, config.precision, config.runtime, config.train
    require(config.task in TASK_NAMES, "task", f"one of {TASK_NAMES}", config.task)
    require(bool(d.train), "data.train", "the path of a training file", d.train)
    for key in PATH_KEYS:
        path = getattr(d, key.split(".")[1])
        require(not path or os.path.isfile(path), key, "an existing file", path)
    formats = TASK_FORMATS[config.task]
    require(d.format in formats, "data.format", f"one of {formats} for task {config.task!r}", d.format)
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
    for split in ("train", "dev", "test"):
        target = getattr(d, f"{split}_target")
        if config.task != "translation":
            require(
                not target, f"data.{split}_target", 'nothing (only task = "translation" reads target files)', target
            )
        elif d.format == "parallel" or target:
            source = getattr(d, split)
            require(
                bool(target) == bool(source),
                f"data.{split}_target",
                f"the target side of data.{split} ({source or 'not set'})",
                target,
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
    require(
        m.num_decoder_layers >= 0,
        "model.num_decoder_layers",
        "an integer >= 0 (0: model.num_layers)",
        m.num_decoder_layers,
    )
    c = config.decode
    require(c.beam_size >= 1, "decode.beam_size", "an integer >= 1 (1: greedy)", c.beam_size)
    require(0 <= c.length_penalty < math.inf, "decode.length_penalty", "a finite number >= 0", c.length_penalty)
    require(c.max_length >= 0, "decode.max_length", "an integer >= 0 (0: data.max_length)", c.max_length)
    require(c.dev_sentences >= 0, "decode.dev_sentences", "an integer >= 0 (0: all)", c.dev_sentences)
    require(c.batch_size >= 1, "decode.batch_size", "an integer >= 1", c.batch_size)
    require(p.policy in POLICIES, "precision.policy", f"one of {POLICIES}", p.policy)
    _validate_loss_scale(p, require)
    require(r.strategy in STRATEGIES, "runtime.strategy", f"one of {STRATEGIES}", r.strategy)
    require(
        r.cpu_replicas >= 0, "runtime.cpu_replicas", "an integer >= 0 (0 or 1: the CPU as one device)", r.cpu_replicas
    )
    require(
        0 < r.collective_timeout < math.inf,
        "runtime.collective_timeout",
        "a finite number of seconds > 0",
        r.collective_timeout,
    )
    require(r.steps_per_execution >= 1, "runtime.steps_per_execution", "an integer >= 1", r.steps_per_execution)
    require(t.steps is None or t.steps >= 1, "train.steps", "an integer >= 1", t.steps)
    require(t.epochs >= 1, "train.epochs", "an integer >= 1", t.epochs)
    require(t.batch_size >= 1, "train.batch_size", "an integer >= 1", t.batch_size)
    require(t.optimizer in ("adam", "adamw"), "train.optimizer", "adam or adamw", t.optimizer)
    require(t.learning_rate > 0, "train.learning_rate", "a number > 0", t.learning_rate)
    require(t.weight_decay >= 0, "train.weight_decay", "a number >= 0", t.weight_decay)
    require(t.warmup_steps >= 0, "train.warmup_steps", "an integer >= 0", t.warmup_steps)
    require(t.decay in ("cosine", "linear", "constant"), "train.decay", "cosine, linear or constant", t.decay)
    require(t.clip_norm >= 0, "train.clip_norm", "a number >= 0 (0: no clipping)", t.clip_norm)
    require(0 < t.outside_weight < math.inf, "train.outside_weight", "a finite number > 0", t.outside_weight)
    require(0 <= t.label_smoothing < 1, "train.label_smoothing", "a number in [0, 1)", t.label_smoothing)
    for key in ("log_every", "checkpoint_every", "max_to_keep"):
        value = getattr(t, key)
        require(value >= 1, f"train.{key}", "an integer >= 1", value)
    require(t.eval_every >= 0, "train.eval_every", "an integer >= 0 (0: once an epoch)", t.eval_every)
    require(t.patience >= 0, "train.patience", "an integer >= 0 (0: no early stopping)", t.patience)
    require(t.on_nonfinite in ON_NONFINITE, "train.on_nonfinite", " | ".join(ON_NONFINITE), t.on_nonfinite)
    require(0 < t.restore_lr_factor <= 1, "train.restore_lr_factor", "a number in (0, 1]", t.restore_lr_factor)
    require(t.max_restores >= 1, "train.max_restores", "an integer >= 1", t.max_restores)
    require(t.accumulation_steps >= 1, "train.accumulation_steps", "an integer >= 1", t.accumulation_steps)
    require(0.0 <= t.ema_decay < 1.0, "train.ema_decay", "a number in [0, 1) (0: no weight average)", t.ema_decay)


def round_up8(value):
    return -(-int(value) // 8) * 8


def _validate_loss_scale(p, require):
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


def to_dict(config):
    """The config as plain dicts, None values left out (TOML has no null)."""
    result = {"task": config.task}
    for name in SECTIONS:
        section = dataclasses.asdict(getattr(config, name))
        result[name] = {k: v for k, v in section.items() if v is not None}
    return result


def save_config(config, path):
    with open(path, "wb") as f:
        tomli_w.dump(to_dict(config), f)


def differing_keys(a, b, ignore=RUN_LENGTH_KEYS + PLACEMENT_KEYS):
    """The `section.key` names whose values differ between two configs."""
    flat_a, flat_b = _flatten(to_dict(a)), _flatten(to_dict(b))
    keys = sorted(set(flat_a) | set(flat_b))
    # How a run decodes does not change what it trains.
    return [k for k in keys if k not in ignore and not k.startswith("decode.") and flat_a.get(k) != flat_b.get(k)]


def _flatten(tree):
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat
