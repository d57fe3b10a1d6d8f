"""RoBERTa (`model_type = "roberta"`): keras-hub's RobertaBackbone, byte-level BPE
(`vocab.json` + `merges.txt`, cased), `<s> ... </s>`, no segment ids, `<pad>` = 1.

Corrected: keras-hub's converter drops RoBERTa's token-type embedding (one row, added to
every piece by `transformers`); it is folded into the position embeddings here, as
keras-hub's own XLM-R converter does (without it the states differ by ~1e-1).
Positions start after the 2 rows RoBERTa reserves: `max_position_embeddings - 2` of them.
"""

import os

from amptrain.models.families.base import Family, bert_layers, cased, encoder_weights
from amptrain.models.families.bert import CONFIG_KEYS


def byte_pair_tokenizer(path, lowercase):
    from amptrain.models.families.tokenizers import BytePairPieces

    return BytePairPieces(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"), pad_id=1)


def weight_shapes(config):
    hidden = config["hidden_size"]
    embeddings = {
        "embeddings.word_embeddings.weight": (config["vocab_size"], hidden),
        "embeddings.token_type_embeddings.weight": (config.get("type_vocab_size", 1), hidden),
    }
    return encoder_weights("", config, extra=embeddings)


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
    config_keys=CONFIG_KEYS,
    tokenizer_files=("vocab.json", "merges.txt"),
    make_tokenizer=byte_pair_tokenizer,
    lowercase=cased,
    layers=bert_layers,
    weight_shapes=weight_shapes,
    position_offset=2,
    pad_id=1,
    correct=fold_token_type,
)
