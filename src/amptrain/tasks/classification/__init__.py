"""Text classification: a CSV or JSON-lines file of texts and labels in, a label and its
probabilities out.

`task` the Task; `model` the Transformer encoder classifier; `pretrained` its head on a
pretrained encoder; `serving` the export's graph, tokenizing in TensorFlow.
"""

from amptrain.tasks.classification.task import ClassificationTask

__all__ = ["ClassificationTask"]
