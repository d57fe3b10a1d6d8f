"""BERT (`model_type = "bert"`): keras-hub's BertBackbone, WordPiece (`vocab.txt`), [CLS] ... [SEP].

keras-hub builds its feed-forward with the tanh GELU; a checkpoint trained with the exact
one (`hidden_act = "gelu"`: BERT, MiniLM) gets it back (`models.pretrained.load_encoder`).
"""

import os

from amptrain.models.families.base import Family, bert_layers


def word_piece_tokenizer(path, lowercase):
    from amptrain.data.vocabulary import WordPiece, load_vocabulary

    return WordPiece.shared(load_vocabulary(os.path.join(path, "vocab.txt")), lowercase=lowercase)


FAMILY = Family(
    model_type="bert",
    backbone="BertBackbone",
    converter="convert_bert",
    make_tokenizer=word_piece_tokenizer,
    layers=bert_layers,
    keras_hub_activation="gelu_approximate",
    segment_ids=True,
    pooler="pooled_dense",
)
