"""A user's own Keras model through `amptrain.Trainer`: built from Python, never from a config
alone.

`task` the Task; `data` the user's datasets or arrays as splits; `scoring` the user's loss
and metrics; `serving` the export's graph over the user's model.
"""

from amptrain.tasks.keras_model.task import KerasModelTask

__all__ = ["KerasModelTask"]
