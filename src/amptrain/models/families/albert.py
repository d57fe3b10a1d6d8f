"""ALBERT (`model_type = "albert"`): keras-hub's AlbertBackbone, SentencePiece (`spiece.model`,
lower-cased and accent-stripped unless `do_lower_case` / `keep_accents` say otherwise),
[CLS] ... [SEP], segment ids, a pooler; factorised embeddings (`embedding_size`) and
layers shared: `num_hidden_groups` layers, each run `num_hidden_layers / groups` times.

The layer-wise learning-rate decay walks the shared layers (one, usually): each is one
layer, at the top; the embeddings one step below.
"""

import os

from amptrain.models.families.base import Family


def sentence_piece_tokenizer(path, lowercase):
    from amptrain.models.families.tokenizers import SentencePieces

    return SentencePieces(
        os.path.join(path, "spiece.model"), pad_id=0, specials=("[CLS]", "[SEP]", "<unk>"), lowercase=lowercase
    )


def shared_layers(encoder):
    return [
        encoder.get_layer(f"group_{g}_inner_layer_{i}")
        for g in range(encoder.num_groups)
        for i in range(encoder.num_inner_repetitions)
    ]


FAMILY = Family(
    model_type="albert",
    backbone="AlbertBackbone",
    converter="convert_albert",
    make_tokenizer=sentence_piece_tokenizer,
    layers=shared_layers,
    keras_hub_activation="gelu_approximate",
    segment_ids=True,
    pooler="pooled_dense",
)
