"""What every text task shares: the files it learns into the run folder, the WordPiece
vocabulary, the batch plan and the `tf.data` stream that serves it.

    class MyTask(TextTask):
        default_lowercase = False
        def batch_builder(self, split): ...   # (indices, length) -> (features, targets, token_counts)

    task.train_dataset(start_step=120)          # the engine pulls from this
    for indices, outputs in task.outputs(predict, split): ...   # every example once, in file order
"""

import abc
import json
import logging
import os

import numpy as np

from amptrain.data.batching import BatchPlan, bucket_boundaries, round_up, rows_for_tokens
from amptrain.data.vocabulary import WordPiece, load_vocabulary, save_vocabulary, train_vocabulary
from amptrain.errors import ConfigError
from amptrain.models.families import family_of
from amptrain.tasks.base import Task, record_pretrained

logger = logging.getLogger("amptrain")

VOCABULARY_FILE = "vocab.txt"
LABELS_FILE = "labels.json"


class TextTask(Task):
    default_lowercase = True  # `data.lowercase` when the config leaves it out

    def __init__(self, config, run_dir):
        super().__init__(config, run_dir)
        self.labels = None
        self.tokenizer = None
        self.boundaries = None  # the training split's bucket lengths (the first prepared split's)

    @property
    def lowercase(self):
        if self.checkpoint is not None:
            return self.checkpoint.lowercase  # as the encoder was trained (config/pretrained.py)
        lowercase = self.config.data.lowercase
        return self.default_lowercase if lowercase is None else lowercase

    def _check_checkpoint(self):
        """The checkpoint's weights recorded in the run folder, or refused (`tasks.base.record_pretrained`)."""
        if self.checkpoint is not None:
            record_pretrained(self.checkpoint, self.run_dir)

    def learning_rate_scales(self, model):
        """A pretrained encoder's layer-wise rates and its weight-decay rule
        (`models.pretrained`); one rate everywhere otherwise."""
        if self.checkpoint is None:
            return None, None
        from amptrain.models.pretrained import decays, learning_rate_scales

        return learning_rate_scales(model, self.config.train), decays

    # === What the task learns, in the run folder ===

    def _saved(self, name):
        return os.path.exists(os.path.join(self.run_dir, name))

    def _learned_files(self):
        """The files the task learns from the training split into the run folder."""
        return [LABELS_FILE, VOCABULARY_FILE]

    def learned_files(self):
        """The names of the files learned into the run folder (`engine.learned_files` hashes them)."""
        return self._learned_files()

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
            return _read_labels(path)
        labels = make()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(labels, f)
        return labels

    def _make_tokenizer(self, train_texts):
        """The pretrained encoder's own tokenizer (its family's: models/families/), its pieces
        recorded in the run folder's vocab.txt; else WordPiece on `_load_or_make_vocabulary`."""
        if self.checkpoint is None:
            return WordPiece.shared(self._load_or_make_vocabulary(train_texts), lowercase=self.lowercase)
        tokenizer = family_of(self.checkpoint).tokenizer(self.checkpoint)
        if tokenizer.size > self.checkpoint.vocabulary_size:
            raise ConfigError(
                f"{self.checkpoint.vocabulary_path}: {tokenizer.size} pieces, but the embedding table of "
                f"{self.checkpoint.path}/config.json has {self.checkpoint.vocabulary_size} rows"
            )
        saved = os.path.join(self.run_dir, VOCABULARY_FILE)
        if not os.path.exists(saved):
            save_vocabulary(tokenizer.vocabulary, saved)
        return tokenizer

    def _load_or_make_vocabulary(self, train_texts, name=VOCABULARY_FILE):
        """The run folder's vocabulary `name`, else `data.vocabulary`, else one trained on
        `train_texts`."""
        d = self.config.data
        saved = os.path.join(self.run_dir, name)
        if os.path.exists(saved):
            return load_vocabulary(saved)
        if self.checkpoint is not None:
            vocabulary = load_vocabulary(self.checkpoint.vocabulary_path)  # no padding: it indexes the embedding
        elif d.vocabulary:
            vocabulary = load_vocabulary(d.vocabulary)
        else:
            logger.info(f"training a WordPiece vocabulary of {d.vocabulary_size} pieces on {d.train} ({name})")
            vocabulary = train_vocabulary(train_texts, d.vocabulary_size, self.lowercase)
        save_vocabulary(vocabulary, saved)
        return vocabulary

    def _add_splits(self, splits):
        """Keeps `splits` (name -> Split); the first one's bucket lengths become the task's
        (`boundaries`), and every other split is padded to buckets of its own lengths. (With
        the first one's, a test text longer than every training text went to the last
        boundary, `max_length`: 100,000 asked for padded a 1,250-piece text to 100,000.)
        Returns the first, or None."""
        if not splits:
            return None
        first = next(iter(splits.values()))
        self.boundaries = self.bucket_lengths(first.lengths)
        for name, split in splits.items():
            split.boundaries = self.boundaries if split is first else self.bucket_lengths(split.lengths)
            self.splits[name] = split
        return first

    def _add_own_split(self, split):
        """Keeps a split read after `prepare` (`add_split`), padded to buckets of its own lengths."""
        self.splits[split.name] = self.own_buckets(split)

    def own_buckets(self, split):
        """`split`, its batches padded to buckets of its own lengths (a file or texts given
        after `prepare`: `add_split`, `predict_texts`)."""
        split.boundaries = self.bucket_lengths(split.lengths)
        return split

    # === Batches ===

    def bucket_lengths(self, lengths):
        """The padded lengths of batches of examples of `lengths` (`data.bucketing`)."""
        d = self.config.data
        return (
            bucket_boundaries(lengths, d.max_length, d.num_buckets, self.config.train.batch_size)
            if d.bucketing
            else [round_up(d.max_length)]
        )

    def batch_rows(self, boundaries=None):
        """Rows a batch: train.batch_size, or each bucket's under data.tokens_per_batch."""
        tokens = self.config.data.tokens_per_batch
        boundaries = self.boundaries if boundaries is None else boundaries
        return rows_for_tokens(boundaries, tokens) if tokens else self.config.train.batch_size

    def train_buckets(self):
        rows = self.batch_rows()
        rows = rows if isinstance(rows, list) else [rows] * len(self.boundaries)
        return list(zip(self.boundaries, rows))

    def probe_batches(self):
        """The batch of the padded length that carries the most padded tokens over an epoch."""
        from amptrain.data.pipeline import plan_dataset

        split = self.splits["train"]
        plan = self.plan(split, shuffle=True)
        tokens, first = {}, {}
        for step in range(plan.steps_per_epoch):
            indices, length = plan.batch(step)[:2]
            key = length if isinstance(length, int) else tuple(length)
            tokens[key] = tokens.get(key, 0) + len(indices) * (sum(key) if isinstance(key, tuple) else key)
            first.setdefault(key, step)
        length = max(tokens, key=tokens.get)
        step = first[length]
        rows = len(plan.batch(step)[0])

        class One:
            steps_per_epoch = 1

            def batch(self, index):
                return plan.batch(step)

        dataset = plan_dataset(One(), self.batch_builder(split), self.signature()).repeat()
        return dataset, (rows, *(length if isinstance(length, tuple) else (length,)))

    def plan(self, split, shuffle):
        """The split's batch plan: shuffled (training) or in file order."""
        rows = self.batch_rows(split.boundaries)
        return BatchPlan(split.lengths, rows, split.boundaries, self.config.runtime.seed, shuffle)

    @abc.abstractmethod
    def batch_builder(self, split):
        """(indices, padded length) -> one batch of `split`: (features, targets, token_counts)."""

    def projections(self, model):
        """The token embedding: the model's largest `Embedding` of at least the vocabulary's rows."""
        table = token_embedding(model, self.tokenizer.size)
        return [] if table is None else [("tokens", table, self.tokenizer.vocabulary, None)]

    def dataset(self, split, plan, start_step=0, num_steps=None, share=None):
        from amptrain.data.pipeline import plan_dataset

        return plan_dataset(plan, self.batch_builder(split), self.signature(), start_step, num_steps, share)

    @property
    def steps_per_epoch(self):
        return self.plan(self.splits["train"], shuffle=True).steps_per_epoch

    def train_dataset(self, start_step, share=None):
        train = self.splits["train"]
        return self.dataset(train, self.plan(train, shuffle=True), start_step, share=share)

    def outputs(self, predict, split):
        """(indices, outputs) of each batch of one unshuffled pass over `split`; index -1 is
        a padding row. Every example is in exactly one batch."""
        plan = self.plan(split, shuffle=False)
        outputs = predict(self.dataset(split, plan, 0, plan.steps_per_epoch))
        return [(indices, output) for (indices, _), output in zip(plan.epoch(0), outputs)]


def token_embedding(model, rows):
    """The embedding table of `model`'s largest `keras.layers.Embedding` (keras-hub's
    `ReversibleEmbedding` is one) of at least `rows` rows: a from-scratch encoder's token
    embedding, or a pretrained backbone's, whose table may have more rows than its pieces."""
    import keras

    from amptrain.models.layer_tree import walk

    found = [layer for layer in walk(model) if isinstance(layer, keras.layers.Embedding) and layer.input_dim >= rows]
    return max(found, key=lambda layer: layer.input_dim).embeddings if found else None


def _read_labels(path):
    """The run's label list; a damaged file is one line naming it."""
    from amptrain.errors import DataError

    try:
        with open(path, encoding="utf-8") as f:
            labels = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: damaged ({error}); expected the JSON list of labels the run learned") from None
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels) or not labels:
        raise DataError(f"{path}: expected a JSON list of label names, received {str(labels)[:80]}")
    return labels


def token_counts(padding_mask):
    """(batch, 2): real and padded tokens of each row, the engine's tokens/s."""
    batch, length = padding_mask.shape
    return np.stack([padding_mask.sum(axis=1), np.full(batch, length)], axis=1).astype(np.int32)


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
