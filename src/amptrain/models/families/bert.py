"""BERT (`model_type = "bert"`): keras-hub's BertBackbone, WordPiece (`vocab.txt`), [CLS] ... [SEP].

keras-hub builds its feed-forward with the tanh GELU; a checkpoint trained with the exact
one (`hidden_act = "gelu"`: BERT, MiniLM) gets it back (`models.pretrained.load_encoder`).
"""

import os

from amptrain.models.families.base import Family, bert_layers, encoder_weights, lower_cased

CONFIG_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_dim": "hidden_size",
    "num_heads": "num_attention_heads",
    "intermediate_dim": "intermediate_size",
    "vocabulary_size": "vocab_size",
    "max_positions": "max_position_embeddings",
}


def word_piece_tokenizer(path, lowercase):
    from amptrain.data.vocabulary import WordPiece, load_vocabulary

    return WordPiece(load_vocabulary(os.path.join(path, "vocab.txt")), lowercase=lowercase)


def weight_shapes(config):
    embeddings = {"embeddings.word_embeddings.weight": (config["vocab_size"], config["hidden_size"])}
    return encoder_weights("", config, extra=embeddings)


FAMILY = Family(
    model_type="bert",
    backbone="BertBackbone",
    converter="convert_bert",
    config_keys=CONFIG_KEYS,
    tokenizer_files=("vocab.txt",),
    make_tokenizer=word_piece_tokenizer,
    lowercase=lower_cased,
    layers=bert_layers,
    weight_shapes=weight_shapes,
    keras_hub_activation="gelu_approximate",
    segment_ids=True,
    pooler="pooled_dense",
)
