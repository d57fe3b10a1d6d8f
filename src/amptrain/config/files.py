"""Config files: a TOML file (or dict) plus `section.key=value` overrides in, a validated
Config out, with types checked and relative paths resolved; a Config back out as TOML,
and the keys in which two configs differ (may a run resume with this one?)."""

import dataclasses
import os
import tomllib
import types
import typing

import tomli_w

from amptrain import registry
from amptrain.config import pretrained
from amptrain.config.sections import OBSERVING_KEYS, PLACEMENT_KEYS, RUN_LENGTH_KEYS, SECTIONS, Config, path_keys
from amptrain.config.validation import validate
from amptrain.errors import ConfigError


def load_config(path, overrides=(), base_dir=None, check_files=True, carried_by=None, trust=False):
    """Reads a TOML file, applies `section.key=value` overrides and validates.

    Relative paths in the file and the overrides resolve against `base_dir`
    (default: the directory the command runs in). `carried_by`: the run or export folder
    the file belongs to, whose config may not choose code (`registry.task_class`); `trust`:
    import the user task module it names all the same.
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
    # A task class named by import path may sit next to its config.
    return config_from_dict(
        raw,
        overrides,
        base_dir=base_dir,
        source=str(path),
        search=[os.path.dirname(str(path))],
        check_files=check_files,
        carried_by=carried_by,
        trust=trust,
    )


def config_from_dict(
    raw, overrides=(), base_dir=None, source="config", search=(), check_files=True, carried_by=None, trust=False
):
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
    task_class = _task_class(raw, source, [*search, base_dir or os.getcwd()], carried_by, trust)
    config = _build(raw, source, task_class)
    config = _resolve_paths(config, base_dir or os.getcwd())
    validate(config, task_class, check_files)
    return pretrained.resolve(config, given=raw.get("model", {}))


def task_class_of(config):
    """The Task subclass `config.task` names (already imported when the config was loaded)."""
    return registry.task_class(config.task, [config.task_path] if config.task_path else [])


def _task_class(raw, source, search, carried_by=None, trust=False):
    task = raw.get("task", Config.task)
    if not isinstance(task, str):
        raise ConfigError(f"{source}: task: expected a string, received {task!r}")
    task_path = raw.get("task_path", "")
    if not isinstance(task_path, str):
        raise ConfigError(f"{source}: task_path: expected a folder's path, received {task_path!r}")
    search = [task_path, *search] if task_path else search
    return registry.task_class(task, search, carried_by=carried_by, trust=trust)


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


def _build(raw, source, task_class):
    task = raw.pop("task", Config.task)
    raw.pop("task_path", None)
    own = task_class.config_sections  # the task's own sections ([decode]) and keys (its `data` subclass)
    for name, cls in own.items():
        if name in SECTIONS and not (isinstance(cls, type) and issubclass(cls, SECTIONS[name])):
            raise ConfigError(f"{task}: its config_sections[{name!r}] must subclass {SECTIONS[name].__name__}")
    known = {**SECTIONS, **own}
    sections = {}
    for name, value in list(raw.items()):
        if name not in known and _an_older_runs_default(name, value):
            continue
        if name not in known:
            raise ConfigError(
                f"{source}: unknown section or key {name!r}; expected one of: task, "
                + ", ".join(f"[{s}]" for s in known)
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: [{name}] must be a table, received {value!r}")
        sections[name] = _build_section(name, known[name], value, source, task)
    task_sections = {name: sections.pop(name, None) or cls() for name, cls in own.items() if name not in SECTIONS}
    shared = {name: sections.pop(name, None) or cls() for name, cls in own.items() if name in SECTIONS}
    return Config(task=task, task_path=registry.module_folder(task), task_sections=task_sections, **sections, **shared)


def _an_older_runs_default(name, values):
    """True for another built-in task's section at its defaults: amptrain before the tasks
    owned their sections saved every task's (`[decode]` in a classification run's config.toml),
    and those run folders must still load."""
    for builtin in registry.known():
        cls = registry.task_class(builtin).config_sections.get(name)
        if cls is not None and isinstance(values, dict):
            defaults = dataclasses.asdict(cls())
            return all(key in defaults and defaults[key] == value for key, value in values.items())
    return False


def _an_older_runs_key(section, key, value):
    """True for another built-in task's key of a shared section at its default: amptrain
    before the tasks owned their keys saved them in every run's config.toml
    (`data.train_target = ""` in a classification run's), and those run folders must still load."""
    for builtin in registry.known():
        cls = registry.task_class(builtin).config_sections.get(section)
        if cls is not None and key in (defaults := dataclasses.asdict(cls())) and defaults[key] == value:
            return True
    return False


def _fields(task_class, section):
    cls = task_class.config_sections.get(section)
    return [f.name for f in dataclasses.fields(cls)] if cls is not None else []


def _build_section(section, cls, values, source, task):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields and section in SECTIONS and _an_older_runs_key(section, key, value):
            continue
        if key not in fields:
            owners = [name for name in registry.known() if key in _fields(registry.task_class(name), section)]
            whose = f" (a key of task {' and '.join(map(repr, owners))}, not of {task!r})" if owners else ""
            raise ConfigError(f"{source}: unknown key {section}.{key}{whose}; [{section}] has: {', '.join(fields)}")
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
    for name in path_keys(data):
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
    if config.task_path:
        result["task_path"] = config.task_path
    for name in [*SECTIONS, *config.task_sections]:
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
    # A task's sections that do not change what it trains (how translation decodes, say).
    free = tuple(f"{name}." for name in task_class_of(a).untrained_sections)
    return [k for k in keys if k not in ignore and not k.startswith(free) and flat_a.get(k) != flat_b.get(k)]


def _flatten(tree):
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat
