"""DistilBERT (`model_type = "distilbert"`): keras-hub's DistilBertBackbone, BERT's WordPiece
(`vocab.txt`), [CLS] ... [SEP], no segment ids, no pooler, its own config keys (`dim`,
`n_layers`, `hidden_dim` for the feed-forward width, `activation`).
"""

from amptrain.models.families.base import Family, bert_layers
from amptrain.models.families.bert import word_piece_tokenizer

FAMILY = Family(
    model_type="distilbert",
    backbone="DistilBertBackbone",
    converter="convert_distilbert",
    make_tokenizer=word_piece_tokenizer,
    layers=bert_layers,
)
