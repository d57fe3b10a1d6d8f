"""A user's data for `amptrain.Trainer`, as the engine's batches.

    source = SplitSource.of(train_ds)                        # a tf.data.Dataset of batches
    source = SplitSource.of((x, y), batch_size=32, seed=0)   # NumPy arrays, batched and shuffled here
    source.batches()          # finite: (features, {"y", "w"}, token_counts) global batches

A user's dataset yields (features, targets) or (features, targets, sample_weight) batches.
Every batch is filled up to the first batch's rows with rows of weight 0 (so the replicas can
share a smaller last batch, and XLA sees one shape); a weight of 0 never counts, in the
loss, the metrics or tokens/s. Real tokens: where the features hold a rank-2 integer tensor
(`token_ids`, or the only such input), its non-zero ids (0 is padding, Keras's `mask_zero`
convention); otherwise a row counts as one.

Exact resume needs batch N of the training data to be the same at every iteration from the
start: a dataset read in order, or shuffled with a seed (`shuffle(..., seed=S)`), and no
randomness outside a seeded op. `fingerprint` hashes the first batches, so that a resume
whose data changed is refused rather than replaying other batches silently.
"""

import dataclasses
import hashlib

import numpy as np

from amptrain.errors import UserError

FINGERPRINT_BATCHES = 2


@dataclasses.dataclass
class SplitSource:
    make: object  # () -> the user's finite tf.data.Dataset of batches
    name: str = "train"

    @classmethod
    def of(cls, value, name, batch_size=None, seed=0, shuffle=False):
        """A split from a `tf.data.Dataset` of batches, or from arrays: (x, y) or (x, y, w)."""
        import tensorflow as tf

        if isinstance(value, tf.data.Dataset):
            return cls(lambda: value, name)
        if isinstance(value, (tuple, list)) and len(value) in (2, 3):
            if not batch_size:
                raise UserError(f"{name}: arrays need a batch size (batch_size=..., or train.batch_size)")
            rows = {len(a) for a in tf.nest.flatten(tuple(value))}
            if len(rows) != 1:
                raise UserError(f"{name}: the arrays have different numbers of rows ({sorted(rows)})")
            data = tf.data.Dataset.from_tensor_slices(tuple(value))
            count = rows.pop()

            def make():
                # Seeded: every pass from the start draws the same orders (exact resume).
                shuffled = data.shuffle(count, seed=seed, reshuffle_each_iteration=True) if shuffle else data
                return shuffled.batch(batch_size)

            return cls(make, name)
        raise UserError(
            f"{name}: expected a tf.data.Dataset of (features, targets[, sample_weight]) batches, or a tuple "
            f"(x, y[, sample_weight]) of arrays with batch_size, received {type(value).__name__}"
        )

    def rows(self):
        """Rows of the first batch: every batch is padded to it."""
        first = next(iter(self.make().take(1)), None)
        if first is None:
            raise UserError(f"{self.name}: the dataset is empty")
        return int(_flat(_split_element(first, self.name)[0])[0].shape[0])

    def batches(self, rows):
        """The finite dataset of (features, {"y", "w"}, token_counts), each padded to `rows`."""
        name = self.name
        return self.make().map(lambda *element: _engine_batch(element, rows, name))

    def count(self):
        """Batches in one pass (counted once when TensorFlow cannot tell)."""
        import tensorflow as tf

        cardinality = int(self.make().cardinality())
        if cardinality == tf.data.INFINITE_CARDINALITY:
            raise UserError(
                f"{self.name}: the dataset is endless; give a finite one (one pass is an epoch) or set train.steps"
            )
        if cardinality >= 0:
            return cardinality
        return sum(1 for _ in self.make())

    def fingerprint(self, rows):
        """A hash of the first batches as the engine sees them (see the module docstring)."""
        digest = hashlib.sha256()
        for element in self.batches(rows).take(FINGERPRINT_BATCHES):
            for tensor in _flat(element):
                digest.update(np.asarray(tensor).tobytes())
        return digest.hexdigest()


def _flat(structure):
    import tensorflow as tf

    return tf.nest.flatten(structure)


def _split_element(element, name):
    if len(element) == 1 and isinstance(element[0], (tuple, list)):
        element = tuple(element[0])
    if len(element) not in (2, 3):
        raise UserError(
            f"{name}: expected batches of (features, targets) or (features, targets, sample_weight), "
            f"received a structure of {len(element)} parts"
        )
    return element


def _engine_batch(element, rows, name):
    """(features, {"y": targets, "w": weights}, token_counts) of one user batch, padded to `rows`."""
    import tensorflow as tf

    features, targets, *weights = _split_element(element, name)
    given = tf.shape(_flat(targets)[0])[0]
    weights = tf.cast(weights[0], tf.float32) if weights else tf.ones([given], tf.float32)

    # Filler rows repeat the batch's first row: a row of zeros could be all padding, whose
    # masked mean divides by zero, and a NaN times a weight of 0 is still NaN.
    indices = tf.concat([tf.range(given), tf.zeros([rows - given], tf.int32)], axis=0)
    live = tf.concat([tf.ones([given]), tf.zeros([rows - given])], axis=0)
    features, targets, weights = tf.nest.map_structure(lambda t: tf.gather(t, indices), (features, targets, weights))
    weights = weights * tf.reshape(live, tf.concat([[rows], tf.ones([tf.rank(weights) - 1], tf.int32)], axis=0))
    return features, {"y": targets, "w": weights}, token_counts(features, weights)


def token_ids_of(features):
    """The rank-2 integer input whose non-zero ids are the real tokens, or None."""
    if isinstance(features, dict) and "token_ids" in features:
        return features["token_ids"]
    candidates = [t for t in _flat(features) if len(t.shape) == 2 and t.dtype.is_integer]
    return candidates[0] if len(candidates) == 1 else None


def token_counts(features, weights):
    """(batch, 2) int32: real and padded tokens of each row; a row of weight 0 has no real token."""
    import tensorflow as tf

    live = tf.reshape(weights, [tf.shape(weights)[0], -1])[:, 0] > 0
    ids = token_ids_of(features)
    if ids is None:
        real = tf.cast(live, tf.int32)
        return tf.stack([real, tf.ones_like(real)], axis=1)
    real = tf.reduce_sum(tf.cast(ids != 0, tf.int32), axis=1) * tf.cast(live, tf.int32)
    return tf.stack([real, tf.fill(tf.shape(real), tf.shape(ids)[1])], axis=1)
