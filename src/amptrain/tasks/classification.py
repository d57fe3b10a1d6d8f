"""Text classification: CSV/TSV/JSONL `text,label` in, accuracy and macro-F1 out.

    task = ClassificationTask(config, run_dir)
    task.prepare()                                     # read, learn the vocabulary, encode
    model = task.build_model(dtype="mixed_bfloat16")
    dataset = task.train_dataset(start_step=0)         # the engine pulls from this
    task.predict_texts(predict, ["see you at lunch"])  # after training

Everything the task learns from the training split (the WordPiece vocabulary and the
label set) is saved in the run folder, so `eval` and `predict` rebuild the same model.
"""

import json
import logging
import os

import numpy as np

from amptrain.data import readers
from amptrain.data.batching import BatchPlan, bucket_boundaries, round_up
from amptrain.data.vocabulary import CLS, PAD_ID, WordPiece, load_vocabulary, save_vocabulary, train_vocabulary

# TensorFlow is imported inside the methods that need it, so that a malformed data
# file is reported (one line, path:line) before TensorFlow's start-up prints anything.

logger = logging.getLogger("amptrain")

VOCABULARY_FILE = "vocab.txt"
LABELS_FILE = "labels.json"


class Split:
    """One split's examples, encoded and truncated to `max_length` (the [CLS] piece included)."""

    def __init__(self, name, path, examples, label_ids, piece_ids, max_length):
        self.name, self.path, self.examples, self.label_ids = name, path, examples, np.asarray(label_ids, np.int32)
        self.token_ids = [ids[:max_length] for ids in piece_ids]
        self.lengths = np.array([len(ids) for ids in self.token_ids])
        self.truncated = int(sum(len(ids) > max_length for ids in piece_ids))


class ClassificationTask:
    primary_metric = "accuracy"

    def __init__(self, config, run_dir):
        self.config = config
        self.run_dir = run_dir
        self.labels = None
        self.tokenizer = None
        self.splits = {}

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        """Reads the splits, learns (or reloads from the run folder) the vocabulary and
        labels, and encodes. Bucket lengths come from the first named split the config has."""
        d = self.config.data
        paths = {"train": d.train, "dev": d.dev, "test": d.test}
        wanted = [name for name in split_names if paths.get(name)]
        if not self._saved(LABELS_FILE) or not self._saved(VOCABULARY_FILE):
            wanted = ["train"] + [name for name in wanted if name != "train"]
        examples = {name: self._read(paths[name]) for name in wanted}
        self.labels = self._load_or_make_labels(examples.get("train"))
        # Unknown labels are reported before any slow work.
        label_ids = {name: readers.label_ids(examples[name], self.labels, paths[name]) for name in wanted}
        self.tokenizer = WordPiece(self._load_or_make_vocabulary(examples.get("train")), lowercase=d.lowercase)
        present = [name for name in split_names if name in examples]
        for name in present:
            self.splits[name] = self._encode(name, paths[name], examples[name], label_ids[name])
        if not present:
            return
        first = self.splits[present[0]]
        self.boundaries = self._boundaries(first.lengths)
        logger.info(
            f"data: {len(first.examples)} {first.name} examples, {len(self.labels)} labels {self.labels}, "
            f"vocabulary {self.tokenizer.size}, {first.truncated} truncated to {d.max_length} pieces, "
            f"bucket lengths {self.boundaries}"
        )

    def _boundaries(self, lengths):
        d = self.config.data
        return bucket_boundaries(lengths, d.max_length, d.num_buckets) if d.bucketing else [round_up(d.max_length)]

    def _saved(self, name):
        return os.path.exists(os.path.join(self.run_dir, name))

    def _read(self, path):
        d = self.config.data
        return readers.read_labelled_text(path, d.text_column, d.label_column, d.format)

    def _load_or_make_labels(self, train_examples):
        path = os.path.join(self.run_dir, LABELS_FILE)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        labels = readers.label_vocabulary(train_examples)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(labels, f)
        return labels

    def _load_or_make_vocabulary(self, train_examples):
        d = self.config.data
        saved = os.path.join(self.run_dir, VOCABULARY_FILE)
        if os.path.exists(saved):
            return load_vocabulary(saved)
        if d.vocabulary:
            vocabulary = load_vocabulary(d.vocabulary)
        else:
            logger.info(f"training a WordPiece vocabulary of {d.vocabulary_size} pieces on {d.train}")
            vocabulary = train_vocabulary([e.text for e in train_examples], d.vocabulary_size, d.lowercase)
        save_vocabulary(vocabulary, saved)
        return vocabulary

    def _encode(self, name, path, examples, label_ids):
        return Split(name, path, examples, label_ids, self.encode_texts([e.text for e in examples]), self.config.data.max_length)

    def encode_texts(self, texts):
        cls = np.array([self.tokenizer.token_id(CLS)], np.int32)
        return [np.concatenate([cls, ids]) for ids in self.tokenizer.encode(texts)]

    def _plan(self, split, shuffle):
        return BatchPlan(split.lengths, self.config.train.batch_size, self.boundaries, self.config.runtime.seed, shuffle)

    def _batch_builder(self, token_ids, label_ids):
        def build(indices, length):
            batch = len(indices)
            ids = np.full((batch, length), PAD_ID, np.int32)
            labels = np.zeros(batch, np.int32)
            for row, index in enumerate(indices):
                if index >= 0:
                    pieces = token_ids[index][:length]
                    ids[row, : len(pieces)] = pieces
                    labels[row] = label_ids[index]
            mask = ids != PAD_ID
            weights = (indices >= 0).astype(np.float32)
            token_counts = np.stack([mask.sum(axis=1), np.full(batch, length)], axis=1).astype(np.int32)
            return {"token_ids": ids, "padding_mask": mask}, {"labels": labels, "weights": weights}, token_counts

        return build

    @staticmethod
    def signature():
        import tensorflow as tf

        return (
            {
                "token_ids": tf.TensorSpec((None, None), tf.int32),
                "padding_mask": tf.TensorSpec((None, None), tf.bool),
            },
            {"labels": tf.TensorSpec((None,), tf.int32), "weights": tf.TensorSpec((None,), tf.float32)},
            tf.TensorSpec((None, 2), tf.int32),
        )

    def _dataset(self, split, plan, start_step=0, num_steps=None):
        from amptrain.data.pipeline import plan_dataset

        build = self._batch_builder(split.token_ids, split.label_ids)
        return plan_dataset(plan, build, self.signature(), start_step, num_steps)

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.models.classifier import build_classifier

        d = self.config.data
        return build_classifier(self.tokenizer.size, round_up(d.max_length), len(self.labels), self.config.model, dtype)

    @staticmethod
    def loss_fn(targets, logits):
        import tensorflow as tf

        # float32: the logits are float32 already; cross-entropy's log-sum-exp stays there.
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets["labels"], logits=logits)
        weights = targets["weights"]
        return tf.reduce_sum(losses * weights), tf.reduce_sum(weights)

    @property
    def steps_per_epoch(self):
        return self._plan(self.splits["train"], shuffle=True).steps_per_epoch

    def train_dataset(self, start_step):
        """The endless training stream from `start_step` on (resume is a start step)."""
        train = self.splits["train"]
        return self._dataset(train, self._plan(train, shuffle=True), start_step)

    # === Evaluation and prediction ===

    def probabilities(self, predict, split):
        """Class probabilities of every example of `split`, in file order."""
        plan = self._plan(split, shuffle=False)
        outputs = predict(self._dataset(split, plan, 0, plan.steps_per_epoch))
        probabilities = np.zeros((len(split.examples), len(self.labels)), np.float32)
        for (indices, _), logits in zip(plan.epoch(0), outputs):
            rows = indices >= 0
            probabilities[indices[rows]] = softmax(logits[rows])
        return probabilities

    def evaluate(self, split_name, predict, predictions_path=None):
        split = self.splits[split_name]
        probabilities = self.probabilities(predict, split)
        predicted = probabilities.argmax(axis=1)
        metrics = classification_metrics(split.label_ids, predicted, len(self.labels))
        metrics["examples"] = len(split.examples)
        if predictions_path:
            self.write_predictions(predictions_path + ".jsonl", split, predicted, probabilities)
        return metrics

    def write_predictions(self, path, split, predicted, probabilities):
        with open(path, "w", encoding="utf-8") as f:
            for example, label, probs in zip(split.examples, predicted, probabilities):
                record = {
                    "text": example.text,
                    "label": example.label,
                    "predicted": self.labels[label],
                    "probabilities": {name: round(float(p), 6) for name, p in zip(self.labels, probs)},
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def add_split(self, name, path):
        """Reads and encodes another labelled file (for `amptrain eval --data`)."""
        examples = self._read(path)
        self.splits[name] = self._encode(name, path, examples, readers.label_ids(examples, self.labels, path))
        self.boundaries = self._boundaries(self.splits[name].lengths)

    def predict_texts(self, predict, texts):
        examples = [readers.Example(text=t, label=self.labels[0], line=i + 1) for i, t in enumerate(texts)]
        split = Split("input", "input", examples, [0] * len(texts), self.encode_texts(texts), self.config.data.max_length)
        self.boundaries = self._boundaries(split.lengths)
        probabilities = self.probabilities(predict, split)
        return [
            {
                "text": text,
                "label": self.labels[int(probs.argmax())],
                "probabilities": {name: round(float(p), 6) for name, p in zip(self.labels, probs)},
            }
            for text, probs in zip(texts, probabilities)
        ]


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def classification_metrics(gold, predicted, num_classes):
    """Accuracy and macro-F1 (the mean of per-class F1 over classes present in gold or predictions)."""
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    f1s = []
    for c in range(num_classes):
        true_positive = np.sum((predicted == c) & (gold == c))
        predicted_c, gold_c = np.sum(predicted == c), np.sum(gold == c)
        if predicted_c == 0 and gold_c == 0:
            continue
        f1s.append(2 * true_positive / (predicted_c + gold_c))
    return {"accuracy": float(np.mean(gold == predicted)), "macro_f1": float(np.mean(f1s)) if f1s else 0.0}
