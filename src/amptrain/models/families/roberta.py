"""RoBERTa (`model_type = "roberta"`): keras-hub's RobertaBackbone, byte-level BPE
(`vocab.json` + `merges.txt`), `<s> ... </s>`, no segment ids, `<pad>` = 1.

Corrected: keras-hub's converter drops RoBERTa's token-type embedding (one row, added to
every piece by `transformers`); it is folded into the position embeddings here, as
keras-hub's own XLM-R converter does (without it the tiny checkpoint's states differ by up to 3.5).
Positions start after the 2 rows RoBERTa reserves: `max_position_embeddings - 2` of them.
"""

import os

from amptrain.models.families.base import Family, bert_layers


def byte_pair_tokenizer(path, lowercase):
    from amptrain.models.families.tokenizers import BytePairPieces

    return BytePairPieces.shared(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"), pad_id=1)


def fold_token_type(encoder, checkpoint):
    """Adds the token-type embedding's row 0 to every position embedding (both are added
    to each piece's embedding before the layer norm, so the sum is unchanged)."""
    from amptrain.config.pretrained_weights import read_tensor

    row = read_tensor(checkpoint.weights_path, "embeddings.token_type_embeddings.weight")[0]
    positions = encoder.embeddings.position_embedding.position_embeddings
    positions.assign(positions + row.astype(positions.dtype))


FAMILY = Family(
    model_type="roberta",
    backbone="RobertaBackbone",
    converter="convert_roberta",
    make_tokenizer=byte_pair_tokenizer,
    layers=bert_layers,
    pad_id=1,
    correct=fold_token_type,
)
