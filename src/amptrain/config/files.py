"""Config files: a TOML file (or dict) plus `section.key=value` overrides in, a validated
Config out, with types checked and relative paths resolved; a Config back out as TOML,
and the keys in which two configs differ (may a run resume with this one?)."""

import dataclasses
import os
import tomllib
import types
import typing

import tomli_w

from amptrain.config import pretrained
from amptrain.config.sections import OBSERVING_KEYS, PATH_KEYS, PLACEMENT_KEYS, RUN_LENGTH_KEYS, SECTIONS, Config
from amptrain.config.validation import validate
from amptrain.errors import ConfigError


def load_config(path, overrides=(), base_dir=None):
    """Reads a TOML file, applies `section.key=value` overrides and validates.

    Relative paths in the file and the overrides resolve against `base_dir`
    (default: the directory the command runs in).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
        raw = tomllib.loads(data.decode("utf-8-sig"))  # an editor's byte-order mark is no error
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a folder, not a config file") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a TOML text file ({error.reason} at byte {error.start})") from None
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
    return pretrained.resolve(config, given=raw.get("model", {}))


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
    model = config.model
    if model.pretrained and not os.path.isabs(model.pretrained):
        model = dataclasses.replace(model, pretrained=os.path.normpath(os.path.join(base_dir, model.pretrained)))
    return dataclasses.replace(config, data=dataclasses.replace(data, **resolved), model=model)


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


def differing_keys(a, b, ignore=RUN_LENGTH_KEYS + PLACEMENT_KEYS + OBSERVING_KEYS):
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
