"""The task registry: the one place a task's name lives.

    task_class("classification")                     # amptrain's ClassificationTask
    task_class("mytasks:SentencePairs", ["tasks/"])   # a user's, by import path
    known()                                          # ("classification", "ner", "translation")

A config's `task` is a name below or a class by import path ("module:Class", the module on
`sys.path` or in one of the folders searched: the config's own, the working directory).
Config validation, the CLI, serving, the probe and the layout test ask this module; an
unknown task is an error naming the known ones, never a fallback.

This is amptrain's one lookup of a module by a name string (the layout test allows no
other): the config names its task, and the config must be read before the task is known.
The built-in classes are named by import path too, not imported here: this module sits
below the config, and a task's package imports the config (docs/architecture.md, "Layers").
"""

import importlib
import os
import sys

from amptrain.errors import ConfigError

CONTRACT_MODULE = "amptrain.tasks.base"  # where `Task` lives (tasks/base.py)
TASKS = {
    "classification": "amptrain.tasks.classification:ClassificationTask",
    "ner": "amptrain.tasks.ner:NerTask",
    "translation": "amptrain.tasks.translation:TranslationTask",
    # a user's own Keras model (amptrain.Trainer): built from Python, never from a config alone
    "keras_model": "amptrain.tasks.keras_model:KerasModelTask",
}


def known():
    return tuple(TASKS)


def is_builtin(name):
    return name in TASKS


def task_class(name, search=()):
    """The Task subclass `name` names (a registry name or "module:Class"); `search`: folders
    in which a user's module may lie, tried before `sys.path` (they are put on it)."""
    path = TASKS.get(name, name)
    if ":" not in path:
        raise ConfigError(
            f"task: expected one of {', '.join(TASKS)} or a task class by import path "
            f'("module:Class", e.g. "mytasks:SentencePairs"), received {name!r}'
        )
    cls = import_object(path, search, what="task")
    if not (isinstance(cls, type) and any(_is_the_contract(base) for base in cls.__mro__)):
        raise ConfigError(f"task: {name!r} is {cls!r}, not a subclass of amptrain.Task (amptrain/tasks/base.py)")
    return cls


def import_object(path, search=(), what="object"):
    """The object "module:Name" names, its module imported from `search` or `sys.path`."""
    module_name, _, attribute = path.partition(":")
    for folder in search:
        folder = os.path.abspath(folder)
        if folder not in sys.path and _holds(folder, module_name):
            sys.path.insert(0, folder)
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
