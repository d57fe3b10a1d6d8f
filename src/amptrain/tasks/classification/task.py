"""Text classification: CSV/TSV/JSONL `text,label` in, accuracy and macro-F1 out.

    task = ClassificationTask(config, run_dir)
    task.prepare()                                     # read, learn the vocabulary, encode
    model, policy, reason = task.create_model()
    dataset = task.train_dataset(start_step=0)         # the engine pulls from this
    task.predict_texts(["see you at lunch"], model, predict)   # after training

Everything the task learns from the training split (the WordPiece vocabulary and the
label set) is saved in the run folder, so `eval` and `predict` rebuild the same model.
"""

import json
import logging

import numpy as np

from amptrain.data import readers
from amptrain.data.batching import round_up
from amptrain.data.vocabulary import PAD_ID
from amptrain.metrics.classification import classification_metrics
from amptrain.tasks.base import Split
from amptrain.tasks.classification.serving import ClassifierModule
from amptrain.tasks.classification.settings import ClassificationData
from amptrain.tasks.text import TextTask, batch_signature, token_counts

# TensorFlow is imported inside the methods that need it, so that a malformed data
# file is reported (one line, path:line) before TensorFlow's start-up prints anything.

logger = logging.getLogger("amptrain")


def text_split(name, path, examples, label_ids, piece_ids, max_length, sep_id=None, keep_tail=0):
    """A split of texts: `token_ids` ([CLS] and pieces, cut to `max_length`) and `label_ids`.
    With `sep_id` (a pretrained encoder's [SEP], which ends every text of `piece_ids`), a
    cut text still ends with it. A cut text keeps its last `keep_tail` pieces after its first
    ones (`cut`)."""
    token_ids = [cut(ids, max_length, sep_id is not None, keep_tail) for ids in piece_ids]
    return Split(
        name,
        path,
        examples,
        {"token_ids": token_ids, "label_ids": np.asarray(label_ids, np.int32)},
        lengths=np.array([len(ids) for ids in token_ids]),
        truncated=int(sum(len(ids) > max_length for ids in piece_ids)),
    )


def cut(ids, max_length, ends_with_sep, keep_tail=0):
    """`ids` ([CLS], the pieces, and [SEP] when `ends_with_sep`) cut to `max_length`: the
    first pieces, then the last `keep_tail` pieces and the [SEP]. `ClassifierModule.token_ids`
    cuts the same way in the serving graph."""
    if len(ids) <= max_length:
        return ids
    end = keep_tail + int(ends_with_sep)
    if end == 0:
        return ids[:max_length]
    return np.concatenate([ids[: max_length - end], ids[len(ids) - end :]])


class ClassificationTask(TextTask):
    primary_metric = "accuracy"
    formats = ("auto", "csv", "tsv", "jsonl")
    pretrained_kind = "encoder"
    serving_module = ClassifierModule
    config_sections = {"data": ClassificationData}

    @classmethod
    def check_config(cls, config):
        from amptrain.config import require

        d = config.data
        super().check_config(config)
        require(
            d.keep_tail == 0 or 0 < d.keep_tail <= d.max_length - 3,
            "data.keep_tail",
            f"an integer from 0 to data.max_length - 3 ({d.max_length - 3}), leaving room for [CLS], [SEP] "
            "and one piece of the text's start",
            d.keep_tail,
        )

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        """Reads the splits, learns (or reloads from the run folder) the vocabulary and
        labels, and encodes. Bucket lengths come from the first named split the config has."""
        d = self.config.data
        self._check_checkpoint()
        wanted, paths = self._wanted_splits(split_names)
        examples = {name: self._read(paths[name]) for name in wanted}
        self.labels = self._load_or_make_labels(lambda: _two_labels_at_least(examples["train"], d.train))
        # Unknown labels are reported before any slow work.
        label_ids = {name: readers.label_ids(examples[name], self.labels, paths[name]) for name in wanted}
        train_texts = [e.text for e in examples["train"]] if "train" in examples else None
        self.tokenizer = self._make_tokenizer(train_texts)
        present = [name for name in split_names if name in examples]
        first = self._add_splits(
            {name: self._encode(name, paths[name], examples[name], label_ids[name]) for name in present}
        )
        if first is not None:
            logger.info(
                f"data: {len(first)} {first.name} examples, {len(self.labels)} labels {self.labels}, "
                f"vocabulary {self.tokenizer.size}, {first.truncated} truncated to {d.max_length} pieces, "
                f"bucket lengths {self.boundaries}"
            )

    def add_split(self, name, path):
        examples = self._read(path)
        self._add_own_split(self._encode(name, path, examples, readers.label_ids(examples, self.labels, path)))

    def _read(self, path):
        d = self.config.data
        return readers.read_labelled_text(path, d.text_column, d.label_column, d.format)

    def _encode(self, name, path, examples, label_ids):
        pieces = self.encode_texts([e.text for e in examples])
        d = self.config.data
        return text_split(name, path, examples, label_ids, pieces, d.max_length, self.sep_id, d.keep_tail)

    @property
    def sep_id(self):
        """[SEP]'s id when a pretrained encoder was trained with it ending every text, else None."""
        return self.tokenizer.end_id if self.checkpoint is not None else None

    def encode_texts(self, texts):
        """[CLS] and each text's pieces (and [SEP] for a pretrained encoder)."""
        cls = np.array([self.tokenizer.start_id], np.int32)  # [CLS], or the family's start piece
        end = np.array([] if self.sep_id is None else [self.sep_id], np.int32)
        return [np.concatenate([cls, ids, end]) for ids in self.tokenizer.encode(texts)]

    def batch_builder(self, split):
        token_ids, label_ids = split.encoded["token_ids"], split.encoded["label_ids"]

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

    def signature(self):
        return batch_signature(target_shape=(None,))

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.tasks.classification.model import build_classifier

        d = self.config.data
        if self.checkpoint is not None:
            from amptrain.tasks.classification.pretrained import build_pretrained_classifier

            return build_pretrained_classifier(self.checkpoint, len(self.labels), self.config.model, dtype)
        return build_classifier(self.tokenizer.size, round_up(d.max_length), len(self.labels), self.config.model, dtype)

    def loss(self, targets, logits):
        """The cross-entropy of each real example, summed, and the number of real examples."""
        from amptrain.models.losses import weighted_cross_entropy

        return weighted_cross_entropy(targets["labels"], logits, targets["weights"])

    # === Evaluation and prediction ===

    def probabilities(self, predict, split):
        """Class probabilities of every example of `split`, in file order."""
        probabilities = np.zeros((len(split), len(self.labels)), np.float32)
        for indices, logits in self.outputs(predict, split):
            rows = indices >= 0
            probabilities[indices[rows]] = softmax(logits[rows])
        return probabilities

    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        split = self.splits[split_name]
        probabilities = self.probabilities(predict, split)
        predicted = probabilities.argmax(axis=1)
        metrics = classification_metrics(split.encoded["label_ids"], predicted, len(self.labels))
        metrics["examples"] = len(split)
        if predictions_path:
            self.write_predictions(predictions_path + self.predictions_suffix, split, predicted, probabilities)
        return metrics

    def write_predictions(self, path, split, predicted, probabilities):
        with open(path, "w", encoding="utf-8") as f:
            for example, label, probs in zip(split.examples, predicted, probabilities):
                record = {"text": example.text, "label": example.label, **self._prediction(label, probs)}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _prediction(self, label, probabilities):
        return {
            "predicted": self.labels[int(label)],
            "probabilities": {name: round(float(p), 6) for name, p in zip(self.labels, probabilities)},
        }

    def predict_texts(self, texts, model, predict):
        examples = [readers.Example(text=t, label=self.labels[0], line=i + 1) for i, t in enumerate(texts)]
        split = self._encode("input", "input", examples, [0] * len(texts))
        probabilities = self.probabilities(predict, self.own_buckets(split))
        records = []
        for text, probs in zip(texts, probabilities):
            prediction = self._prediction(probs.argmax(), probs)
            records.append(
                {"text": text, "label": prediction["predicted"], "probabilities": prediction["probabilities"]}
            )
        return records


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _two_labels_at_least(examples, path):
    """The training split's labels; one alone is refused: the classifier would learn to
    answer it always and report accuracy 1.0."""
    from amptrain.errors import DataError

    labels = readers.label_vocabulary(examples)
    if len(labels) < 2:
        raise DataError(
            f"{path}: every example has the label {labels[0]!r}; a classifier needs at least two labels "
            "in its training split"
        )
    return labels
