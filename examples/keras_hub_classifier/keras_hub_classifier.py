"""A keras-hub task model, `keras_hub.models.BertTextClassifier`, trained through amptrain.

A user holding a keras-hub model hands its builder to `amptrain.Trainer`, which builds it
under the precision policy (and a strategy's scope), scales the loss when the policy needs
it, keeps the best checkpoint by dev accuracy, scores it on test and exports it (a
SavedModel). Nothing is downloaded:
the tokenizer is keras-hub's `BertTokenizer` on a vocabulary list, the backbone either a
tiny one built from its config or the local MiniLM folder (a Hugging Face BERT checkpoint,
read by `BertBackbone.from_preset(folder)`).

    python examples/keras_hub_classifier/keras_hub_classifier.py                  # tiny backbone
    python examples/keras_hub_classifier/keras_hub_classifier.py --pretrained pretrained/all-MiniLM-L6-v2
    python examples/keras_hub_classifier/keras_hub_classifier.py --limit 64 --set train.steps=4 --run-dir /tmp/x

Data: the bundled spam mails (data/classify-spam), tokenized once, before training, by
keras-hub's `BertTextClassifierPreprocessor` into token_ids, segment_ids and padding_mask
(the backbone's three inputs; id 0 is [PAD], as amptrain counts real tokens). The tiny
backbone's WordPiece vocabulary is learned on the training split
(`amptrain.data.vocabulary.train_vocabulary`); MiniLM brings its own (vocab.txt).

Under `mixed_bfloat16` the classifier's logits come out in bfloat16 (keras-hub builds its
head under the backbone's policy); amptrain's loss casts them to float32 before the
cross-entropy.
"""

import argparse
import csv
import json
import os
import sys

import keras
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPAM = os.path.join(ROOT, "data", "classify-spam")
MINILM = os.path.join(ROOT, "pretrained", "all-MiniLM-L6-v2")
LABELS = ["ham", "spam"]
SEQUENCE_LENGTH = 128
TINY = {"num_layers": 2, "num_heads": 2, "hidden_dim": 32, "intermediate_dim": 64}
VOCABULARY_SIZE = 4000  # the tiny backbone's WordPiece vocabulary, learned on train


# === The user's model ===


def classifier_builder(vocabulary, pretrained=None, backbone_config=None, dropout=0.1):
    """policy -> keras_hub BertTextClassifier: on the MiniLM folder's weights when `pretrained`
    names it, else on a fresh backbone of `backbone_config` (the tiny one by default)."""
    import keras_hub

    def build(policy):
        if pretrained:
            backbone = keras_hub.models.BertBackbone.from_preset(pretrained, dtype=policy)
        else:
            backbone = keras_hub.models.BertBackbone(
                vocabulary_size=len(vocabulary),
                max_sequence_length=SEQUENCE_LENGTH,
                dropout=dropout,
                dtype=policy,
                **(backbone_config or TINY),
            )
        # No preprocessor: the data arrive tokenized, so the model's inputs are the backbone's.
        return keras_hub.models.BertTextClassifier(backbone, len(LABELS), preprocessor=None, dropout=dropout)

    return build


# === The user's data ===


def read_split(split, folder=SPAM, limit=None):
    with open(os.path.join(folder, f"{split}.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))[:limit]
    return [r["text"] for r in rows], np.array([LABELS.index(r["label"]) for r in rows], np.int32)


def vocabulary_for(texts, pretrained=None, size=VOCABULARY_SIZE):
    """The WordPiece vocabulary: the checkpoint's own, or one learned on `texts`."""
    if pretrained:
        with open(os.path.join(pretrained, "vocab.txt"), encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    from amptrain.data.vocabulary import train_vocabulary

    return train_vocabulary(texts, size=size, lowercase=True)


def load_spam(folder=SPAM, limit=None, pretrained=None, sequence_length=SEQUENCE_LENGTH):
    """(vocabulary, {split: (features, labels)}): each mail as keras-hub's preprocessor gives it,
    `[CLS] pieces [SEP]` cut or padded to `sequence_length`."""
    import keras_hub

    splits = {split: read_split(split, folder, limit) for split in ("train", "dev", "test")}
    vocabulary = vocabulary_for(splits["train"][0], pretrained)
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    preprocess = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=sequence_length)
    data = {}
    for split, (texts, labels) in splits.items():
        features = {name: np.asarray(value) for name, value in preprocess(texts).items()}
        features["padding_mask"] = features["padding_mask"].astype(np.int32)  # the backbone's input is int32
        data[split] = (features, labels)
    return vocabulary, data


# === Training ===

CONFIG = {
    "precision.policy": "mixed_bfloat16",
    "train.epochs": 3,
    "train.batch_size": 32,
    "train.optimizer": "adam",
    "train.learning_rate": 1e-3,
    "train.warmup_steps": 0,
    "train.log_every": 50,
    "train.checkpoint_every": 100,
}
PRETRAINED_CONFIG = {**CONFIG, "train.learning_rate": 5e-5, "train.epochs": 1}  # fine-tuning: a small step


def trainer(vocabulary, data, run_dir, settings=(), pretrained=None, overwrite=False, backbone_config=None):
    import amptrain

    config = {**(PRETRAINED_CONFIG if pretrained else CONFIG), **dict(settings)}
    return amptrain.Trainer(
        model=classifier_builder(vocabulary, pretrained, backbone_config),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        train=data["train"],
        validation=data["dev"],
        test=data["test"],
        config=config,
        run_dir=run_dir,
        overwrite=overwrite,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=os.path.join(ROOT, "runs", "keras-hub-classifier"))
    parser.add_argument("--set", action="append", default=[], help="a config key, e.g. train.steps=20")
    parser.add_argument("--limit", type=int, help="the first N mails of each split (a quick try)")
    parser.add_argument("--pretrained", help=f"a local Hugging Face BERT folder to start from, e.g. {MINILM}")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.pretrained and not os.path.isdir(args.pretrained):
        parser.error(f"--pretrained: {args.pretrained} is no folder (make pretrained fetches MiniLM)")
    from amptrain.config import parse_override

    vocabulary, data = load_spam(limit=args.limit, pretrained=args.pretrained)
    settings = [parse_override(s) for s in args.set]
    run = trainer(vocabulary, data, args.run_dir, settings, args.pretrained, args.overwrite)
    history = run.fit()  # as model.fit's, with the best checkpoint's test metrics
    export = run.export(overwrite=True)
    print(json.dumps({"test": history.test, "export": export["path"]}))
    print(f"run folder: {args.run_dir}   (tensorboard --logdir {args.run_dir}/tensorboard)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
