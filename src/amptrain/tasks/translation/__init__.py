"""Translation: tab-separated source and target sentences in, a translation out.

`task` the Task; `model` the encoder-decoder Transformer; `decoding` its greedy and beam
search; `detokenize` pieces back to text; `bleu` the scores; `serving` the export's graph.
"""

from amptrain.tasks.translation.task import TranslationTask

__all__ = ["TranslationTask"]
