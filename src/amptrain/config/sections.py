"""The configuration tree: one frozen dataclass a section, their defaults, the values some
keys allow, and the groups of keys that other modules treat alike.

These are the keys every task has. A task adds its own (`Task.config_sections`): a section
of its own (translation's `[decode]`), or keys of a shared section in a subclass of its
dataclass (translation's `data.train_target`, NER's `train.outside_weight`)."""

import dataclasses
from dataclasses import dataclass, field

CONCRETE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
POLICIES = (*CONCRETE_POLICIES, "auto")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
CLUSTER_SOURCES = ("auto", "tf_config", "slurm", "kubernetes", "none")  # runtime.cluster
LOSS_SCALES = ("auto", "dynamic", "none")
ON_NONFINITE = ("stop", "skip", "restore")


def path_field():
    """A key that names a file: resolved against the config's folder, checked to exist."""
    return field(default="", metadata={"path": True})


def path_keys(section):
    """The names of a section's keys that name files (`path_field`)."""
    return [f.name for f in dataclasses.fields(section) if f.metadata.get("path")]


@dataclass(frozen=True)
class DataConfig:
    train: str = path_field()
    dev: str = path_field()
    test: str = path_field()
    format: str = "auto"  # csv | tsv | jsonl (classification), conll (ner), tsv | parallel (translation) | auto
    vocabulary: str = path_field()  # a vocab.txt to load; empty: train one on data.train
    vocabulary_size: int = 8000
    lowercase: bool | None = None  # None: the task's default (classification lowercases, ner and translation keep case)
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
    # "blocks": each Transformer block keeps only its input for the backward pass and is
    # recomputed there (models/remat.py): about one more forward pass for most of the memory
    # a row of the batch takes; "none": every activation kept
    remat: str = "none"
    # a pretrained encoder's folder (classification, ner): Hugging Face (config.json,
    # model.safetensors, vocab.txt) or keras-hub preset layout; the shape keys above then
    # come from it (config/pretrained.py), its vocabulary and casing too
    pretrained: str = ""


@dataclass(frozen=True)
class PrecisionConfig:
    # "auto": measured at the start of the run (autoprecision/probe.py) among `allow`
    policy: str = "auto"
    # the policies "auto" may choose (and the probe may try); a named policy must be one of them
    allow: list = field(default_factory=lambda: list(CONCRETE_POLICIES))
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
    # where a cluster comes from: "auto" (TF_CONFIG, else a SLURM step of several tasks,
    # else a Kubernetes Indexed Job), "tf_config", "slurm", "kubernetes" or "none"
    # (distribute/schedulers.py)
    cluster: str = "auto"
    devices: str = ""  # comma-separated, e.g. "/gpu:0,/gpu:1"; empty: every GPU (else the CPU)
    cpu_replicas: int = 0  # > 1: split the CPU into this many logical devices (for mirrored)
    tpu: str = ""  # the TPU's name or grpc:// address; "local" for a TPU VM; empty: from TPU_NAME
    collective_timeout: float = 300.0  # seconds a cross-worker all-reduce may wait for a peer
    startup_timeout: float = 180.0  # seconds every worker of a cluster has to arrive (distribute/startup.py)
    # true | false | "fusible" | "auto". true: XLA compiles the step; "fusible": only the
    # elementwise ops between the matrix products (xla_modes.py); "auto": measured
    # with the precision at the start of the run (autoprecision/probe.py)
    jit_compile: bool | str = "auto"
    # the exact GELU's forward and backward run as small XLA computations in a training
    # step that is not compiled whole (xla_modes.py)
    fused_kernels: bool = True
    steps_per_execution: int = 1
    seed: int = 0
    deterministic: bool = False
    check_numerics: bool = False  # tf.debugging.enable_check_numerics; turns XLA off
    # [first, last]: trace these steps (rounded to whole graph calls) into the run's
    # TensorBoard folder for the profile plugin; empty: no profiling
    profile_steps: list = field(default_factory=list)


@dataclass(frozen=True)
class TrainConfig:
    steps: int | None = None  # when given, wins over epochs
    epochs: int = 3
    batch_size: int = 32
    optimizer: str = "adamw"  # adam | adamw
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    # with model.pretrained: the learning rate of the new head (0: train.learning_rate), and
    # each encoder layer's rate times this per layer below the top (1: the same everywhere)
    head_learning_rate: float = 0.0
    layer_decay: float = 1.0
    decay: str = "cosine"  # cosine | linear | constant
    clip_norm: float = 1.0  # 0 turns clipping off
    log_every: int = 25
    eval_every: int = 0  # 0: once an epoch
    eval_on_start: bool = False  # score dev and test before the first step: the base beside the trained
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
    # > 0: weight and gradient histograms in TensorBoard every this many steps; 0: off
    histogram_every: int = 0
    # rows of each token embedding written for TensorBoard's projector with the best
    # checkpoint (the most frequent pieces where their counts are known); 0: none
    projector_rows: int = 10000

    def total_steps(self, steps_per_epoch):
        """`steps` when given, else `epochs` passes over the data."""
        return self.steps if self.steps is not None else self.epochs * steps_per_epoch


@dataclass(frozen=True)
class Config:
    """A run's whole configuration. `task` is a registry name or a task class by import path
    (amptrain/registry.py); `task_path` the folder of a user's task module (empty for
    amptrain's own); `task_sections` the task's own sections (its `config_sections`, e.g.
    translation's `[decode]`), which read as attributes: `config.decode`."""

    task: str = "classification"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task_path: str = ""
    task_sections: dict = field(default_factory=dict)

    def __getattr__(self, name):
        sections = self.__dict__.get("task_sections", {})  # not yet set while unpickling
        if name in sections:
            return sections[name]
        raise AttributeError(f"the config has no section {name!r} (task {self.__dict__.get('task')!r})")


# The sections every task has (a task adds its own: Task.config_sections).
SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name not in ("task", "task_path", "task_sections")}
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
    "runtime.startup_timeout",
)
# Keys that only say what a run records about itself: a rerun may change them and resume.
OBSERVING_KEYS = ("runtime.profile_steps", "train.histogram_every", "train.projector_rows")
PATH_KEYS = tuple(f"data.{name}" for name in path_keys(DataConfig))  # a task's data section may add more
