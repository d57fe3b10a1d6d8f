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

import numpy as np

from amptrain.data import readers
from amptrain.data.batching import round_up
from amptrain.data.vocabulary import CLS, PAD_ID, WordPiece
from amptrain.tasks.common import TextTask, batch_signature, token_counts, weighted_cross_entropy

# TensorFlow is imported inside the methods that need it, so that a malformed data
# file is reported (one line, path:line) before TensorFlow's start-up prints anything.

logger = logging.getLogger("amptrain")


class Split:
    """One split's examples, encoded and truncated to `max_length` (the [CLS] piece included)."""

    def __init__(self, name, path, examples, label_ids, piece_ids, max_length):
        self.name, self.path, self.examples, self.label_ids = name, path, examples, np.asarray(label_ids, np.int32)
        self.token_ids = [ids[:max_length] for ids in piece_ids]
        self.lengths = np.array([len(ids) for ids in self.token_ids])
        self.truncated = int(sum(len(ids) > max_length for ids in piece_ids))


class ClassificationTask(TextTask):
    primary_metric = "accuracy"

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        """Reads the splits, learns (or reloads from the run folder) the vocabulary and
        labels, and encodes. Bucket lengths come from the first named split the config has."""
        d = self.config.data
        wanted, paths = self._wanted_splits(split_names)
        examples = {name: self._read(paths[name]) for name in wanted}
        self.labels = self._load_or_make_labels(lambda: readers.label_vocabulary(examples["train"]))
        # Unknown labels are reported before any slow work.
        label_ids = {name: readers.label_ids(examples[name], self.labels, paths[name]) for name in wanted}
        train_texts = [e.text for e in examples["train"]] if "train" in examples else None
        self.tokenizer = WordPiece(self._load_or_make_vocabulary(train_texts), lowercase=self.lowercase)
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

    def _read(self, path):
        d = self.config.data
        return readers.read_labelled_text(path, d.text_column, d.label_column, d.format)

    def _encode(self, name, path, examples, label_ids):
        return Split(
            name, path, examples, label_ids, self.encode_texts([e.text for e in examples]), self.config.data.max_length
        )

    def encode_texts(self, texts):
        cls = np.array([self.tokenizer.token_id(CLS)], np.int32)
        return [np.concatenate([cls, ids]) for ids in self.tokenizer.encode(texts)]

    @staticmethod
    def _batch_builder(split):
        token_ids, label_ids = split.token_ids, split.label_ids

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
            return {"token_ids": ids, "padding_mask": mask}, {"labels": labels, "weights": weights}, token_counts(mask)

        return build

    @staticmethod
    def signature():
        return batch_signature(target_shape=(None,))

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.models.classifier import build_classifier

        d = self.config.data
        return build_classifier(self.tokenizer.size, round_up(d.max_length), len(self.labels), self.config.model, dtype)

    loss_fn = staticmethod(weighted_cross_entropy)

    # === Evaluation and prediction ===

    def probabilities(self, predict, split):
        """Class probabilities of every example of `split`, in file order."""
        probabilities = np.zeros((len(split.examples), len(self.labels)), np.float32)
        for indices, logits in self.outputs(predict, split):
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
            self.write_predictions(predictions_path + self.predictions_suffix, split, predicted, probabilities)
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
        split = Split(
            "input", "input", examples, [0] * len(texts), self.encode_texts(texts), self.config.data.max_length
        )
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
