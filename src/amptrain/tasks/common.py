"""What every text task shares: the files it learns into the run folder, the WordPiece
vocabulary, the batch plan and the `tf.data` stream that serves it.

    class MyTask(TextTask):
        default_lowercase = False
        def _batch_builder(self, split): ...   # (indices, length) -> (features, targets, token_counts)

    task.train_dataset(start_step=120)          # the engine pulls from this
    for indices, outputs in task.outputs(predict, split): ...   # every example once, in file order

A split is any object with `lengths` (pieces per example, as the model sees them).
"""

import json
import logging
import os

import numpy as np

from amptrain.data.batching import BatchPlan, bucket_boundaries, round_up, rows_for_tokens
from amptrain.data.vocabulary import load_vocabulary, save_vocabulary, train_vocabulary

logger = logging.getLogger("amptrain")

VOCABULARY_FILE = "vocab.txt"
LABELS_FILE = "labels.json"


class TextTask:
    primary_metric = None
    default_lowercase = True  # `data.lowercase` when the config leaves it out
    predictions_suffix = ".jsonl"  # of `predictions-test`, which `evaluate` writes
    keeps_blank_lines = False  # `predict --input`: blank lines are skipped (translation keeps them)

    def __init__(self, config, run_dir):
        self.config = config
        self.run_dir = run_dir
        self.labels = None
        self.tokenizer = None
        self.splits = {}
        self.during_fit = False  # set by `api.fit`: evaluations between training steps may be quicker

    @property
    def lowercase(self):
        lowercase = self.config.data.lowercase
        return self.default_lowercase if lowercase is None else lowercase

    # === What the task learns, in the run folder ===

    def _saved(self, name):
        return os.path.exists(os.path.join(self.run_dir, name))

    def _learned_files(self):
        """The files the task learns from the training split into the run folder."""
        return [LABELS_FILE, VOCABULARY_FILE]

    def _wanted_splits(self, split_names):
        """The named splits the config has, with `train` first when the run folder has not
        learned its files (`_learned_files`) from it yet."""
        d = self.config.data
        paths = {"train": d.train, "dev": d.dev, "test": d.test}
        wanted = [name for name in split_names if paths.get(name)]
        if not all(self._saved(name) for name in self._learned_files()):
            wanted = ["train"] + [name for name in wanted if name != "train"]
        return wanted, paths

    def _load_or_make_labels(self, make):
        """The label list saved in the run folder, else `make()` (from the training split), saved."""
        path = os.path.join(self.run_dir, LABELS_FILE)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        labels = make()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(labels, f)
        return labels

    def _load_or_make_vocabulary(self, train_texts, name=VOCABULARY_FILE):
        """The run folder's vocabulary `name`, else `data.vocabulary`, else one trained on
        `train_texts`."""
        d = self.config.data
        saved = os.path.join(self.run_dir, name)
        if os.path.exists(saved):
            return load_vocabulary(saved)
        if d.vocabulary:
            vocabulary = load_vocabulary(d.vocabulary)
        else:
            logger.info(f"training a WordPiece vocabulary of {d.vocabulary_size} pieces on {d.train} ({name})")
            vocabulary = train_vocabulary(train_texts, d.vocabulary_size, self.lowercase)
        save_vocabulary(vocabulary, saved)
        return vocabulary

    # === Batches ===

    def _boundaries(self, lengths):
        d = self.config.data
        return (
            bucket_boundaries(lengths, d.max_length, d.num_buckets, self.config.train.batch_size)
            if d.bucketing
            else [round_up(d.max_length)]
        )

    def batch_rows(self):
        """Rows a batch: train.batch_size, or each bucket's under data.tokens_per_batch."""
        tokens = self.config.data.tokens_per_batch
        return rows_for_tokens(self.boundaries, tokens) if tokens else self.config.train.batch_size

    def _plan(self, split, shuffle):
        return BatchPlan(split.lengths, self.batch_rows(), self.boundaries, self.config.runtime.seed, shuffle)

    def _dataset(self, split, plan, start_step=0, num_steps=None):
        from amptrain.data.pipeline import plan_dataset

        return plan_dataset(plan, self._batch_builder(split), self.signature(), start_step, num_steps)

    @property
    def steps_per_epoch(self):
        return self._plan(self.splits["train"], shuffle=True).steps_per_epoch

    def train_dataset(self, start_step):
        """The endless training stream from `start_step` on (resume is a start step)."""
        train = self.splits["train"]
        return self._dataset(train, self._plan(train, shuffle=True), start_step)

    def outputs(self, predict, split):
        """(indices, outputs) of each batch of one unshuffled pass over `split`; index -1 is
        a padding row. Every example is in exactly one batch."""
        plan = self._plan(split, shuffle=False)
        outputs = predict(self._dataset(split, plan, 0, plan.steps_per_epoch))
        return [(indices, output) for (indices, _), output in zip(plan.epoch(0), outputs)]


def token_counts(padding_mask):
    """(batch, 2): real and padded tokens of each row, the engine's tokens/s."""
    batch, length = padding_mask.shape
    return np.stack([padding_mask.sum(axis=1), np.full(batch, length)], axis=1).astype(np.int32)


def sparse_cross_entropy(labels, logits):
    """-log softmax(logits)[label], for labels of any shape, in float32.

    Not `tf.nn.sparse_softmax_cross_entropy_with_logits`: once a process has turned op
    determinism on (`runtime.deterministic`), TensorFlow swaps in a version that holds a
    NaN constant (the answer for an out-of-range label), and check-numerics mode stops on
    that constant in every healthy run."""
    import tensorflow as tf

    # float32: the logits are float32 already; log_softmax's log-sum-exp stays there.
    log_probabilities = tf.nn.log_softmax(logits)
    return -tf.reduce_sum(tf.one_hot(labels, tf.shape(logits)[-1], dtype=logits.dtype) * log_probabilities, axis=-1)


def weighted_cross_entropy(targets, logits):
    """(sum of weighted cross-entropies, sum of weights) over `labels` of any shape."""
    import tensorflow as tf

    losses = sparse_cross_entropy(targets["labels"], logits)
    weights = targets["weights"]
    return tf.reduce_sum(losses * weights), tf.reduce_sum(weights)


def batch_signature(target_shape):
    """The specs of a text task's batches: (features, targets, token_counts). `target_shape`:
    (None,) for a label an example, (None, None) for a tag a piece."""
    import tensorflow as tf

    return (
        {
            "token_ids": tf.TensorSpec((None, None), tf.int32),
            "padding_mask": tf.TensorSpec((None, None), tf.bool),
        },
        {"labels": tf.TensorSpec(target_shape, tf.int32), "weights": tf.TensorSpec(target_shape, tf.float32)},
        tf.TensorSpec((None, 2), tf.int32),
    )
