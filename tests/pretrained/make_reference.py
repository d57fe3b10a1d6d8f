"""Makes the pretrained-encoder test data with the reference implementation, Hugging Face
`transformers` on PyTorch, in a throw-away environment (never an amptrain dependency):

    python3.11 -m venv /tmp/hf && /tmp/hf/bin/pip install torch==2.13.0 transformers safetensors \
        sentencepiece tokenizers protobuf
    make pretrained                                   # pretrained/all-MiniLM-L6-v2
    /tmp/hf/bin/python tests/pretrained/make_reference.py            # everything
    /tmp/hf/bin/python tests/pretrained/make_reference.py families   # the other families only

It writes, under tests/pretrained/:
- tiny-bert/: a BERT of hidden 16, 2 layers, 2 heads, randomly initialised (seed 0) and
  saved in the Hugging Face layout (config.json, model.safetensors, vocab.txt,
  tokenizer_config.json), the tests' checkpoint; its vocabulary is MiniLM's special
  tokens, ASCII characters (alone and as ## continuations) and the most frequent words of
  the bundled spam and WNUT-17 training files that MiniLM has;
- reference-tiny-bert.json and reference-minilm.json: for each of SENTENCES, the piece ids
  of `transformers`' tokenizer ([CLS] ... [SEP]) and the encoder's last hidden states in
  float32 (MiniLM: the first 8 of 384 features a piece, to keep the file small).

- tiny-roberta/, tiny-xlm-roberta/, tiny-distilbert/, tiny-albert/ and their
  reference-tiny-*.json: the other families (make_families.py), same sizes, each with a
  tokenizer trained here on a few hundred lines of the bundled data.

Rerun it only to change these files; the tests compare amptrain's tokenizer and its
keras-hub encoder against them (tests/pretrained/test_pretrained.py).
"""

import collections
import csv
import json
import os
import re

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MINILM = os.path.join(ROOT, "pretrained", "all-MiniLM-L6-v2")
TINY = os.path.join(HERE, "tiny-bert")
SENTENCES = [
    "Hello World, this is MiniLM.",
    "WIN a FREE cruise!!! Click http://example.com now",
    "Café déjà vu: naïve résumé at 9:30am",
    "@jessica going to the Empire State Building tonight #nyc",
]
MINILM_FEATURES = 8


def frequent_words(limit):
    words = collections.Counter()
    with open(os.path.join(ROOT, "data", "classify-spam", "train.csv"), encoding="utf-8", newline="") as f:
        for row in list(csv.reader(f))[1:]:
            words.update(re.findall(r"[a-z]+", row[0].lower()))
    with open(os.path.join(ROOT, "data", "ner-wnut17", "train.conll"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                words.update(re.findall(r"[a-z]+", line.split()[0].lower()))
    return [w for w, _ in words.most_common(limit)]


def tiny_vocabulary():
    with open(os.path.join(MINILM, "vocab.txt"), encoding="utf-8") as f:
        minilm = [line.rstrip("\n") for line in f]
    known = set(minilm)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(33, 127)]
    pieces = [c for c in chars if c in known] + ["##" + c for c in chars if "##" + c in known]
    words = [w for w in frequent_words(2000) if w in known and w not in pieces][:300]
    return special + pieces + words


def make_tiny():
    os.makedirs(TINY, exist_ok=True)
    vocabulary = tiny_vocabulary()
    with open(os.path.join(TINY, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocabulary) + "\n")
    with open(os.path.join(TINY, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocabulary),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=128,
        initializer_range=0.5,  # large, so that the layers' outputs differ clearly from their inputs
    )
    BertModel(config).save_pretrained(TINY, safe_serialization=True)


def reference(folder, features=None):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder).eval()
    records = []
    for sentence in SENTENCES:
        encoded = tokenizer(sentence, return_tensors="pt")
        with torch.no_grad():
            states = model(**encoded).last_hidden_state[0]
        if features:
            states = states[:, :features]
        records.append({"text": sentence, "ids": encoded["input_ids"][0].tolist(), "states": states.tolist()})
    return {"made_by": "tests/pretrained/make_reference.py", "torch": torch.__version__, "sentences": records}


def main():
    import sys

    import make_families

    if sys.argv[1:] == ["families"]:
        make_families.main()
        return
    make_tiny()
    for name, folder, features in (("tiny-bert", TINY, None), ("minilm", MINILM, MINILM_FEATURES)):
        with open(os.path.join(HERE, f"reference-{name}.json"), "w", encoding="utf-8") as f:
            json.dump(reference(folder, features), f)
        print(f"reference-{name}.json")
    make_families.main()


if __name__ == "__main__":
    main()
