"""XLM-RoBERTa (`model_type = "xlm-roberta"`): keras-hub's XLMRobertaBackbone, SentencePiece
(`sentencepiece.bpe.model`, cased, fairseq's ids: the model's plus one), `<s> ... </s>`, no
segment ids, `<pad>` = 1. keras-hub's converter already folds the token-type embedding in.
"""

import os

from amptrain.models.families.base import Family, bert_layers, cased
from amptrain.models.families.bert import CONFIG_KEYS
from amptrain.models.families.roberta import weight_shapes


def sentence_piece_tokenizer(path, lowercase):
    from amptrain.models.families.tokenizers import SentencePieces

    return SentencePieces(
        os.path.join(path, "sentencepiece.bpe.model"), pad_id=1, specials=("<s>", "</s>", "<unk>"), fairseq=True
    )


FAMILY = Family(
    model_type="xlm-roberta",
    backbone="XLMRobertaBackbone",
    converter="convert_xlm_roberta",
    config_keys=CONFIG_KEYS,
    tokenizer_files=("sentencepiece.bpe.model",),
    make_tokenizer=sentence_piece_tokenizer,
    lowercase=cased,
    layers=bert_layers,
    weight_shapes=weight_shapes,
    position_offset=2,
    pad_id=1,
)
