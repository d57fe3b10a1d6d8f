"""Named-entity tagging: CoNLL files of words and BIO tags in, entities out.

`task` the Task; `conll` the file format; `features` the word features (shape, characters,
the alignment of words to pieces); `chars` the character-level word encoder; `model` the
tagger; `pretrained` its head on a pretrained encoder; `spans` the entity scores;
`character_table` and `serving` the export's graph.
"""

from amptrain.tasks.ner.task import NerTask

__all__ = ["NerTask"]
