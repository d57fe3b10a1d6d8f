"""Tasks: each builds data, model, loss, metrics and prediction from the config.

A plain dict maps the config's `task` name to its class.
"""

from amptrain.tasks.classification import ClassificationTask
from amptrain.tasks.ner import NerTask
from amptrain.tasks.translation import TranslationTask

TASKS = {"classification": ClassificationTask, "ner": NerTask, "translation": TranslationTask}
