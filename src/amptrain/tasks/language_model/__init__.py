"""Language models: a decoder-only Transformer pretrained on a text corpus.

`task` the Task; `corpus` the text files, documents and token files; `vocabulary` the
byte-level BPE learned from the training text; `model` the Transformer; `generation`
continuing prompts with cached keys and values; `serving` the export's graph.
"""

from amptrain.tasks.language_model.task import LanguageModelTask

__all__ = ["LanguageModelTask"]
