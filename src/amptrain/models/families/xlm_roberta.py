"""XLM-RoBERTa (`model_type = "xlm-roberta"`): keras-hub's XLMRobertaBackbone, SentencePiece
(`sentencepiece.bpe.model`, fairseq's ids: the model's plus one), `<s> ... </s>`, no
segment ids, `<pad>` = 1. keras-hub's converter already folds the token-type embedding in.
"""

import os

from amptrain.models.families.base import Family, bert_layers


def sentence_piece_tokenizer(path, lowercase):
    from amptrain.models.families.tokenizers import SentencePieces

    return SentencePieces(
        os.path.join(path, "sentencepiece.bpe.model"), pad_id=1, specials=("<s>", "</s>", "<unk>"), fairseq=True
    )


FAMILY = Family(
    model_type="xlm-roberta",
    backbone="XLMRobertaBackbone",
    converter="convert_xlm_roberta",
    make_tokenizer=sentence_piece_tokenizer,
    layers=bert_layers,
    pad_id=1,
)
