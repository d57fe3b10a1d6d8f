"""The tiny random checkpoints of the families beyond BERT, made with `transformers` in its
own environment (make_reference.py says how; never an amptrain dependency).

Each folder is what `save_pretrained` writes for a model of hidden 16 (ALBERT: 32 wide,
embeddings 16), 2 layers, 2 heads, randomly initialised (seed 0, a large initializer range
so the layers change their inputs clearly), and its tokenizer:
- tiny-roberta/: byte-level BPE (vocab.json + merges.txt) of 400 pieces, cased;
- tiny-xlm-roberta/: a SentencePiece unigram model (sentencepiece.bpe.model) of 400 pieces;
- tiny-distilbert/: tiny-bert's WordPiece vocab.txt, lower-cased;
- tiny-albert/: a SentencePiece unigram model (spiece.model) of 400 pieces, lower-cased
  and accent-stripped as `AlbertTokenizer` does by default.
The tokenizers are trained on the first CORPUS_LINES texts of the bundled spam and WNUT-17
training files. reference-tiny-<family>.json holds, for each of SENTENCES, `transformers`'
ids (with its special tokens) and last hidden states in float32, and for WORDS (a sentence
given as words, as NER does) the ids and each word's first piece.
"""

import csv
import json
import os
import shutil

import sentencepiece as spm
import torch
from make_reference import HERE, ROOT, SENTENCES, TINY
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AlbertConfig,
    AlbertModel,
    AlbertTokenizer,
    AutoModel,
    AutoTokenizer,
    DistilBertConfig,
    DistilBertModel,
    DistilBertTokenizer,
    RobertaConfig,
    RobertaModel,
    RobertaTokenizer,
    XLMRobertaConfig,
    XLMRobertaModel,
    XLMRobertaTokenizer,
)

CORPUS_LINES = 300
# The BERT sentences, and a German one (umlauts, ß) with a long word cut across pieces.
FAMILY_SENTENCES = [*SENTENCES, "Schöne Grüße aus Düsseldorf: unbelievably straßenbahn"]
WORDS = ["@jessica", "going", "to", "the", "Empire", "State", "Building", "tonight", "#nyc", "Café"]
SIZE = {"num_hidden_layers": 2, "num_attention_heads": 2, "initializer_range": 0.5}
# What the released RoBERTa and XLM-R configs say (transformers' defaults are BERT's).
ROBERTA = {"layer_norm_eps": 1e-5, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}


def corpus():
    lines = []
    with open(os.path.join(ROOT, "data", "classify-spam", "train.csv"), encoding="utf-8", newline="") as f:
        lines += [row[0][:300] for row in list(csv.reader(f))[1 : CORPUS_LINES + 1]]
    sentence = []
    with open(os.path.join(ROOT, "data", "ner-wnut17", "train.conll"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                sentence.append(line.split()[0])
            elif sentence:
                lines.append(" ".join(sentence))
                sentence = []
            if len(lines) >= 2 * CORPUS_LINES:
                break
    return lines


def folder(name):
    path = os.path.join(HERE, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def sentencepiece_model(path, name, **options):
    model = os.path.join(path, name)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_prefix=model[: -len(".model")],
        vocab_size=400,
        model_type="unigram",
        character_coverage=0.9995,  # the rarest characters are <unk>, as in real models
        hard_vocab_limit=False,
        minloglevel=2,
        **options,
    )
    os.remove(model[: -len(".model")] + ".vocab")
    return model


def saved_tokenizer(cls, path, **options):
    """`cls` read from the vocabulary files in `path` (as from a folder of the family's own
    files; transformers 5 ignores a `vocab_file` argument), then saved there its own way."""
    tokenizer = cls.from_pretrained(path, **options)
    tokenizer.save_pretrained(path)
    return tokenizer


def make_roberta():
    path = folder("tiny-roberta")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(path)
    tokenizer = saved_tokenizer(RobertaTokenizer, path)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, **SIZE, **ROBERTA)
    config.max_position_embeddings = 130  # 128 positions after the 2 that RoBERTa reserves
    RobertaModel(config, add_pooling_layer=False).save_pretrained(path)
    return path


def make_xlm_roberta():
    path = folder("tiny-xlm-roberta")
    sentencepiece_model(path, "sentencepiece.bpe.model")
    tokenizer = saved_tokenizer(XLMRobertaTokenizer, path)
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, **SIZE, **ROBERTA)
    config.max_position_embeddings = 130
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(path)
    return path


def make_distilbert():
    path = folder("tiny-distilbert")
    shutil.copy(os.path.join(TINY, "vocab.txt"), path)
    tokenizer = saved_tokenizer(DistilBertTokenizer, path, do_lower_case=True)
    config = DistilBertConfig(
        vocab_size=len(tokenizer), dim=16, hidden_dim=32, n_layers=2, n_heads=2, initializer_range=0.5
    )
    config.max_position_embeddings = 128
    DistilBertModel(config).save_pretrained(path)
    return path


def make_albert():
    path = folder("tiny-albert")
    sentencepiece_model(
        path, "spiece.model", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"]
    )
    tokenizer = saved_tokenizer(AlbertTokenizer, path, do_lower_case=True, keep_accents=False)
    config = AlbertConfig(
        vocab_size=len(tokenizer),
        embedding_size=16,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=128,
        **SIZE,
    )
    AlbertModel(config).save_pretrained(path)
    return path


def reference(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    records = []
    for sentence in FAMILY_SENTENCES:
        encoded = tokenizer(sentence, return_tensors="pt")
        with torch.no_grad():
            states = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
        ids = encoded["input_ids"][0].tolist()
        records.append({"text": sentence, "ids": ids, "states": states.last_hidden_state[0].tolist()})
    # NER tokenizes words: RoBERTa's byte-level BPE then needs the space before each word.
    word_tokenizer = AutoTokenizer.from_pretrained(path, add_prefix_space=True) if "roberta" in path else tokenizer
    encoded = word_tokenizer(WORDS, is_split_into_words=True)
    word_ids = encoded.word_ids()
    firsts = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
    words = {"words": WORDS, "ids": encoded["input_ids"], "first_pieces": firsts}
    return {"made_by": "tests/pretrained/make_reference.py", "torch": torch.__version__, "sentences": records, **words}


def main():
    for make in (make_roberta, make_xlm_roberta, make_distilbert, make_albert):
        torch.manual_seed(0)
        path = make()
        name = os.path.basename(path)
        with open(os.path.join(HERE, f"reference-{name}.json"), "w", encoding="utf-8") as f:
            json.dump(reference(path), f)
        print(f"reference-{name}.json", sorted(os.listdir(path)))
