"""DistilBERT (`model_type = "distilbert"`): keras-hub's DistilBertBackbone, BERT's WordPiece
(`vocab.txt`), [CLS] ... [SEP], no segment ids, no pooler, its own config keys (`dim`,
`n_layers`, `hidden_dim` for the feed-forward width, `activation`).
"""

from amptrain.models.families.base import Family, bert_layers, lower_cased
from amptrain.models.families.bert import word_piece_tokenizer

CONFIG_KEYS = {
    "num_layers": "n_layers",
    "hidden_dim": "dim",
    "num_heads": "n_heads",
    "intermediate_dim": "hidden_dim",
    "vocabulary_size": "vocab_size",
    "max_positions": "max_position_embeddings",
}


def weight_shapes(config):
    dim, intermediate = config["dim"], config["hidden_dim"]
    shapes = {"embeddings.word_embeddings.weight": (config["vocab_size"], dim)}
    for i in range(config["n_layers"]):
        shapes[f"transformer.layer.{i}.attention.q_lin.weight"] = (dim, dim)
        shapes[f"transformer.layer.{i}.ffn.lin2.weight"] = (dim, intermediate)
    return shapes


FAMILY = Family(
    model_type="distilbert",
    backbone="DistilBertBackbone",
    converter="convert_distilbert",
    config_keys=CONFIG_KEYS,
    tokenizer_files=("vocab.txt",),
    make_tokenizer=word_piece_tokenizer,
    lowercase=lower_cased,
    layers=bert_layers,
    weight_shapes=weight_shapes,
    activation_key="activation",
)
