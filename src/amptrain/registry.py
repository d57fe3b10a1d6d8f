"""The task registry: the one place a task's name lives.

    task_class("classification")                     # amptrain's ClassificationTask
    task_class("mytasks:SentencePairs", ["tasks/"])   # a user's, by import path
    task_class(name, [folder], carried_by="runs/x")   # named by a run folder: only code this user ran
    trust_task_code("mytasks:SentencePairs")          # after `fit` imported it: this user ran it
    known()                                          # ("classification", "ner", "translation")

A config's `task` is a name below or a class by import path ("module:Class", the module on
`sys.path` or in one of the folders searched: the config's own, the working directory).
Config validation, the CLI, serving, the probe and the layout test ask this module; an
unknown task is an error naming the known ones, never a fallback.

A config that names a task module runs that module: the user's own config, a choice made at
`fit`. A run folder or an export carries its config too, and must not be able to choose code:
a user's task named by one (`carried_by`) is imported only when it is a module file this user
has trained with on this machine (`trust_task_code` keeps its path and SHA-256 in the
per-user cache at each `fit`), or when the user passes `--trust-run-code`. Nothing of the
folder is imported to check that; the run folder's `task-code.json` says where `fit` found
the module, for the refusal's one line.

This is amptrain's one lookup of a module by a name string (the layout test allows no
other): the config names its task, and the config must be read before the task is known.
The built-in classes are named by import path too, not imported here: this module sits
below the config, and a task's package imports the config (docs/architecture.md, "Layers").
"""

import hashlib
import importlib
import inspect
import json
import os
import re
import sys
from importlib.machinery import PathFinder

from amptrain.errors import ConfigError
from amptrain.files import atomic_write, cache_dir

CONTRACT_MODULE = "amptrain.tasks.base"  # where `Task` lives (tasks/base.py)
TASKS = {
    "classification": "amptrain.tasks.classification:ClassificationTask",
    "ner": "amptrain.tasks.ner:NerTask",
    "translation": "amptrain.tasks.translation:TranslationTask",
    "language_model": "amptrain.tasks.language_model:LanguageModelTask",
    # a user's own Keras model (amptrain.Trainer): built from Python, never from a config alone
    "keras_model": "amptrain.tasks.keras_model:KerasModelTask",
}


CODE_RECORD_FILE = "task-code.json"  # in a run folder: the user task module `fit` imported
TRUST_OPTION = "--trust-run-code"
MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def known():
    return tuple(TASKS)


def is_builtin(name):
    return name in TASKS


def task_class(name, search=(), carried_by=None, trust=False):
    """The Task subclass `name` names (a registry name or "module:Class"); `search`: folders
    in which a user's module may lie, tried before `sys.path` (they are put on it).
    `carried_by`: the run or export folder whose config named it (the module docstring);
    `trust`: import a user's module it names all the same."""
    path = TASKS.get(name, name)
    if not isinstance(path, str) or not MODULE_PATH.fullmatch(path):
        raise ConfigError(
            f"task: expected one of {', '.join(TASKS)} or a task class by import path "
            f'("module:Class", dotted names, e.g. "mytasks:SentencePairs"), received {name!r}'
        )
    checked = None
    if carried_by is not None and not trust and not is_builtin(name):
        checked = check_task_code(name, search, carried_by)
    cls = import_object(path, search, what="task")
    imported = getattr(sys.modules.get(path.partition(":")[0]), "__file__", None)
    if checked is not None and imported and os.path.abspath(imported) != checked:  # never expected
        raise ConfigError(f"{carried_by}: task {name!r} was checked at {checked} but imported from {imported}")
    if not (isinstance(cls, type) and any(_is_the_contract(base) for base in cls.__mro__)):
        raise ConfigError(f"task: {name!r} is {cls!r}, not a subclass of amptrain.Task (amptrain/tasks/base.py)")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ConfigError(f"task: {name!r} is abstract: it does not implement {missing} (amptrain/tasks/base.py)")
    return cls


def trust_task_code(name):
    """After `fit` imported the user's task `name`: its module file and SHA-256, kept in the
    per-user cache (this user ran it) and returned for the run folder's CODE_RECORD_FILE;
    None for a built-in task."""
    module = sys.modules.get(name.partition(":")[0]) if not is_builtin(name) else None
    file = getattr(module, "__file__", None)
    if not file or not os.path.isfile(file):
        return None
    record = {"task": name, "module": module.__name__, "file": os.path.abspath(file), "sha256": _sha256(file)}
    path = _trust_path(record["file"], record["sha256"])
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, json.dumps(record) + "\n")
    return record


def check_task_code(name, search, carried_by):
    """Refuses, in one line naming TRUST_OPTION, the user task module that `carried_by`'s
    config names unless this user trained with that very file here; imports nothing.
    Returns the file checked (None: the module was imported already, nothing new runs)."""
    module_name = name.partition(":")[0]
    if module_name in sys.modules:
        return None
    file = find_module_file(module_name, search)
    recorded = _read_json(os.path.join(carried_by, CODE_RECORD_FILE))
    recorded = recorded if isinstance(recorded, dict) else {}
    digest = _sha256(file) if file is not None else None
    if file is not None and os.path.exists(_trust_path(file, digest)):
        return file
    if file is None:
        where = recorded.get("file")
        found = "whose module is not found" + (f" (`fit` imported it from {where})" if where else "")
    elif not recorded:
        found = f"code in {file} that this folder does not say `fit` ran (made elsewhere, or by an older amptrain)"
    elif recorded.get("file") != file:
        found = f"code in {file}, not where `fit` found it ({recorded.get('file')})"
    elif recorded.get("sha256") != digest:
        found = f"code in {file} that changed since `fit` ran it"
    else:
        found = f"code in {file} that this user has not run `fit` with on this machine"
    raise ConfigError(
        f"{carried_by}: its config names the task {name!r}, {found}; a folder's config does not choose "
        f"what runs: pass {TRUST_OPTION} to import it if you trust it"
    )


def find_module_file(module_name, search=()):
    """The file `import module_name` would run, found as the import system finds it (the
    folders `import_object` puts first, then `sys.path`), without running anything; None if
    there is none."""
    folders = _search_folders(module_name, search)
    spec = None
    for i, part in enumerate(module_name.split(".")):
        where = [*folders, *sys.path] if i == 0 else list(spec.submodule_search_locations or [])
        spec = PathFinder.find_spec(part, where) if where or i == 0 else None
        if spec is None:
            return None
    origin = spec.origin
    return os.path.abspath(origin) if origin and os.path.isfile(origin) else None


def _search_folders(module_name, search):
    """The folders of `search` that hold `module_name`'s top package and are not on
    `sys.path` yet, in order: where `import_object` looks first."""
    found = []
    for folder in map(os.path.abspath, search):
        if folder not in sys.path and folder not in found and _holds(folder, module_name):
            found.append(folder)
    return found


def _trust_path(file, sha256):
    key = hashlib.sha256(f"{os.path.abspath(file)}\0{sha256}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), "trusted-task-code", f"{key}.json")


def _sha256(file):
    with open(file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def import_object(path, search=(), what="object"):
    """The object "module:Name" names, its module imported from `search` or `sys.path`."""
    module_name, _, attribute = path.partition(":")
    sys.path[:0] = _search_folders(module_name, search)  # in `search`'s order, before the rest
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        where = ", ".join([*map(os.path.abspath, search), "sys.path"])
        raise ConfigError(
            f"{what}: cannot import module {module_name!r} of {path!r} (looked in {where}): {error}"
        ) from None
    if not hasattr(module, attribute):
        raise ConfigError(f"{what}: module {module_name!r} ({module.__file__}) has no {attribute!r}")
    return getattr(module, attribute)


def module_folder(name):
    """The folder holding the module of a user's task (recorded in the run's config, so that
    `eval`, `predict` and `export RUN` import it from any directory); "" for a registry name."""
    if is_builtin(name) or ":" not in name:
        return ""
    module = sys.modules.get(name.partition(":")[0])
    file = getattr(module, "__file__", None)
    if not file:
        return ""
    # The folder on sys.path sits above the module's package, one level a dotted part.
    folder = os.path.dirname(os.path.abspath(file))
    levels = name.partition(":")[0].count(".") + (os.path.basename(file) == "__init__.py")
    for _ in range(levels):
        folder = os.path.dirname(folder)
    return folder


def _holds(folder, module_name):
    top = module_name.split(".")[0]
    return os.path.isfile(os.path.join(folder, top + ".py")) or os.path.isdir(os.path.join(folder, top))


def _is_the_contract(cls):
    """Whether `cls` is `amptrain.tasks.base.Task` (the contract sits above this module, so it
    is recognised, not imported)."""
    return cls.__module__ == CONTRACT_MODULE and cls.__qualname__ == "Task"
