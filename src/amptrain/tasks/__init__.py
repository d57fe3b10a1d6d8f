"""Tasks: each builds data, model, loss, metrics and prediction from the config (the
contract: `tasks/base.py`; the names: `amptrain/registry.py`).

    task = create_task(config, run_dir)        # the config's task, learning into run_dir
    task = prepared_in_scratch(config)         # its training split prepared; nothing kept on disk
"""

import tempfile

from amptrain.config.files import task_class_of


def create_task(config, run_dir):
    """The task `config.task` names (a registry name or a class by import path), built with
    its final config and saving what it learns into `run_dir`."""
    return task_class_of(config)(config, run_dir)


def prepared_in_scratch(config, split_names=("train",)):
    """The config's task with `split_names` prepared in a throw-away folder (removed on
    return): the audit and the benchmarks need its data and model, not a run folder."""
    with tempfile.TemporaryDirectory(prefix="amptrain-scratch-") as scratch:
        task = create_task(config, scratch)
        task.prepare(split_names)
    return task
