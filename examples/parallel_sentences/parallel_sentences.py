"""A task of your own, named by import path: is this Spanish line the translation of this
English line? Parallel-sentence detection on the bundled en-es verses.

    # parallel-sentences.toml
    task = "parallel_sentences:ParallelSentences"   # this module, found next to the config

    amptrain fit examples/parallel_sentences/parallel-sentences.toml
    amptrain predict runs/parallel-sentences \
        --text $'In the beginning God created the heaven.\tEn el principio crió Dios los cielos.'

Each verse pair of a split is a positive example; its negative pairs the same English line
with the Spanish line of another verse of the same split, drawn with `runtime.seed`. One
WordPiece vocabulary covers both languages; the model reads `[CLS] english [SEP] spanish
[SEP]` with a segment embedding telling the two apart. A text for `predict` (and for the
export's `serving_default` signature) is `english<TAB>spanish`.

Nothing here is amptrain's own code: it uses amptrain's public modules (the Task contract,
the data readers, the vocabulary, the encoder blocks, the serving module base), as a
user's task would.
"""

import json
import os

import numpy as np
from pair_serving import PairModule

from amptrain.data.parallel import read_parallel
from amptrain.data.vocabulary import CLS, PAD_ID, SEP, WordPiece, load_vocabulary, save_vocabulary, train_vocabulary
from amptrain.errors import UserError
from amptrain.metrics.classification import classification_metrics
from amptrain.tasks.base import Split
from amptrain.tasks.text import VOCABULARY_FILE, TextTask, batch_signature, token_counts

LABELS = ["other", "translation"]  # label 1: the Spanish line translates the English one


def room(english, spanish, budget):
    """(pieces kept of each side) when both must fit `budget`: each side keeps at least half
    of it, or all of itself, and a short side leaves the rest to the other.
    `PairModule.token_ids` cuts the same way in the serving graph."""
    half = budget // 2
    kept_english = min(english, max(half, budget - spanish))
    return kept_english, min(spanish, budget - kept_english)


def with_negatives(pairs, seed, salt):
    """(english, spanish, label) of each pair, then each English line with the Spanish line of
    another pair of the same split (a pure function of `seed` and `salt`, the split's name)."""
    n = len(pairs)
    rng = np.random.default_rng([seed, sum(map(ord, salt))])
    others = (np.arange(n) + rng.integers(1, max(n, 2), size=n)) % max(n, 1)
    examples = [(p.source, p.target, 1) for p in pairs]
    examples += [(p.source, pairs[j].target, 0) for p, j in zip(pairs, others) if n > 1]
    return examples


class ParallelSentences(TextTask):
    primary_metric = "accuracy"
    formats = ("auto", "tsv")
    serving_module = PairModule  # its serving graph, in this folder too

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        d = self.config.data
        paths = {"train": d.train, "dev": d.dev, "test": d.test}
        self.labels = LABELS
        self.tokenizer = WordPiece(self._vocabulary(d.train), lowercase=self.lowercase)
        for name in split_names:
            if paths.get(name):
                self.add_split(name, paths[name])
        if "train" in self.splits:
            self.boundaries = self.splits["train"].boundaries

    def _vocabulary(self, train_path):
        """The run folder's vocabulary, else one trained on both sides of the training split."""
        saved = os.path.join(self.run_dir, VOCABULARY_FILE)
        if os.path.exists(saved):
            return load_vocabulary(saved)
        pairs = read_parallel(train_path)
        texts = [p.source for p in pairs] + [p.target for p in pairs]
        vocabulary = train_vocabulary(texts, self.config.data.vocabulary_size, self.lowercase)
        save_vocabulary(vocabulary, saved)
        return vocabulary

    def add_split(self, name, path):
        examples = with_negatives(read_parallel(path), self.config.runtime.seed, name)
        self.splits[name] = self.own_buckets(self.encode(name, path, examples))

    def encode(self, name, path, examples):
        """A split of (english, spanish, label) examples: `token_ids` and `segment_ids`
        ([CLS] english [SEP] spanish [SEP], each side cut by `room`) and `label_ids`."""
        english = self.tokenizer.encode([e[0] for e in examples])
        spanish = self.tokenizer.encode([e[1] for e in examples])
        cls, sep = self.tokenizer.token_id(CLS), self.tokenizer.token_id(SEP)
        budget = self.config.data.max_length - 3
        token_ids, segment_ids, truncated = [], [], 0
        for a, b in zip(english, spanish):
            kept_a, kept_b = room(len(a), len(b), budget)
            truncated += kept_a + kept_b < len(a) + len(b)
            ids = np.concatenate([[cls], a[:kept_a], [sep], b[:kept_b], [sep]]).astype(np.int32)
            token_ids.append(ids)
            segment_ids.append(np.repeat(np.array([0, 1], np.int32), [kept_a + 2, kept_b + 1]))
        encoded = {"token_ids": token_ids, "segment_ids": segment_ids, "label_ids": np.array([e[2] for e in examples])}
        lengths = np.array([len(ids) for ids in token_ids])
        return Split(name, path, examples, encoded, lengths, truncated=truncated)

    def batch_builder(self, split):
        token_ids, segment_ids = split.encoded["token_ids"], split.encoded["segment_ids"]
        label_ids = split.encoded["label_ids"]

        def build(indices, length):
            ids = np.full((len(indices), length), PAD_ID, np.int32)
            segments = np.zeros((len(indices), length), np.int32)
            labels = np.zeros(len(indices), np.int32)
            for row, index in enumerate(indices):
                if index >= 0:
                    ids[row, : len(token_ids[index])] = token_ids[index]
                    segments[row, : len(segment_ids[index])] = segment_ids[index]
                    labels[row] = label_ids[index]
            mask = ids != PAD_ID
            features = {"token_ids": ids, "padding_mask": mask, "segment_ids": segments}
            return features, {"labels": labels, "weights": (indices >= 0).astype(np.float32)}, token_counts(mask)

        return build

    def signature(self):
        import tensorflow as tf

        features, targets, counts = batch_signature(target_shape=(None,))
        return {**features, "segment_ids": tf.TensorSpec((None, None), tf.int32)}, targets, counts

    # === Model and loss ===

    def build_model(self, dtype):
        from pair_model import build_pair_classifier

        return build_pair_classifier(self.tokenizer.size, self.config.data.max_length, self.config.model, dtype)

    def loss(self, targets, logits):
        from amptrain.models.losses import weighted_cross_entropy

        return weighted_cross_entropy(targets["labels"], logits, targets["weights"])

    # === Evaluation and prediction ===

    def probabilities(self, predict, split):
        probabilities = np.zeros((len(split), len(LABELS)), np.float32)
        for indices, logits in self.outputs(predict, split):
            rows = indices >= 0
            shifted = np.exp(logits[rows] - logits[rows].max(axis=1, keepdims=True))
            probabilities[indices[rows]] = shifted / shifted.sum(axis=1, keepdims=True)
        return probabilities

    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        split = self.splits[split_name]
        probabilities = self.probabilities(predict, split)
        metrics = classification_metrics(split.encoded["label_ids"], probabilities.argmax(axis=1), len(LABELS))
        metrics["examples"] = len(split)
        if predictions_path:
            with open(predictions_path + self.predictions_suffix, "w", encoding="utf-8") as f:
                for (english, spanish, label), probs in zip(split.examples, probabilities):
                    record = {"english": english, "spanish": spanish, "gold": LABELS[label], **_record(probs)}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return metrics

    def predict_texts(self, texts, model, predict):
        examples = []
        for number, text in enumerate(texts, 1):
            english, tab, spanish = text.partition("\t")
            if not tab or not english.strip() or not spanish.strip():
                raise UserError(f"text {number}: expected 'english<TAB>spanish', received {text[:60]!r}")
            examples.append((english, spanish, 0))
        split = self.own_buckets(self.encode("input", "input", examples))
        return [{"text": t, **_record(p)} for t, p in zip(texts, self.probabilities(predict, split))]


def _record(probabilities):
    return {
        "label": LABELS[int(probabilities.argmax())],
        "probabilities": {name: round(float(p), 6) for name, p in zip(LABELS, probabilities)},
    }
