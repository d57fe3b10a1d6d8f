"""Tasks: each builds data, model, loss, metrics and prediction from the config.

A plain dict maps the config's `task` name to its class.
"""

from amptrain.tasks.classification import ClassificationTask

TASKS = {"classification": ClassificationTask}
