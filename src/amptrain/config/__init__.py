"""One frozen configuration tree a run: TOML plus `--set section.key=value` overrides.

    config = load_config("configs/classify-spam.toml", ["train.steps=200"])
    config.train.batch_size  # 32

Unknown keys, wrong types and impossible values stop the run before any work, with
a message naming the key, what was expected and what was received.

One concept a module: `sections` (the dataclasses, their defaults and allowed values),
`validation` (validate: the checks on values), `files` (TOML and overrides in, TOML out,
comparing two configs). The names are re-exported here, so `config.X` works.
"""

from amptrain.config.files import (
    config_from_dict,
    differing_keys,
    load_config,
    parse_override,
    save_config,
    to_dict,
)
from amptrain.config.sections import (
    LOSS_SCALES,
    ON_NONFINITE,
    PATH_KEYS,
    PLACEMENT_KEYS,
    POLICIES,
    RUN_LENGTH_KEYS,
    SECTIONS,
    STRATEGIES,
    Config,
    DataConfig,
    ModelConfig,
    PrecisionConfig,
    RuntimeConfig,
    TrainConfig,
)
from amptrain.config.validation import require, round_up8, validate
from amptrain.errors import ConfigError

__all__ = [
    "LOSS_SCALES",
    "ON_NONFINITE",
    "PATH_KEYS",
    "PLACEMENT_KEYS",
    "POLICIES",
    "RUN_LENGTH_KEYS",
    "SECTIONS",
    "STRATEGIES",
    "Config",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "PrecisionConfig",
    "RuntimeConfig",
    "TrainConfig",
    "config_from_dict",
    "differing_keys",
    "load_config",
    "parse_override",
    "require",
    "round_up8",
    "save_config",
    "to_dict",
    "validate",
]
