"""The cross-entropies the tasks' losses are made of, in float32, as (sum, count) pairs.

    loss_sum, count = weighted_cross_entropy(labels, logits, weights)
    loss_sum, count = smoothed_cross_entropy(labels, logits, weights, smoothing=0.1)

Every task's loss returns the sum of its per-target losses and the number of real targets
on one replica; the engine all-reduces both and divides (see `tasks/base.py`).
"""

import tensorflow as tf


def sparse_cross_entropy(labels, logits):
    """-log softmax(logits)[label], for labels of any shape, in float32.

    Not `tf.nn.sparse_softmax_cross_entropy_with_logits`: once a process has turned op
    determinism on (`runtime.deterministic`), TensorFlow swaps in a version that holds a
    NaN constant (the answer for an out-of-range label), and check-numerics mode stops on
    that constant in every healthy run."""
    # float32: softmax over the classes overflows half precision; its log-sum-exp stays here.
    log_probabilities = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    return -tf.reduce_sum(tf.one_hot(labels, tf.shape(logits)[-1], dtype=tf.float32) * log_probabilities, axis=-1)


def weighted_cross_entropy(labels, logits, weights, count_weights=True):
    """(sum of the weighted cross-entropies, count). `count_weights`: the count is the sum of
    the weights (a padding row weighs 0); else the number of targets of non-zero weight (NER:
    `O` words weigh less but each still counts as one word)."""
    losses = sparse_cross_entropy(labels, logits)
    count = tf.reduce_sum(weights) if count_weights else tf.reduce_sum(tf.cast(weights > 0, tf.float32))
    return tf.reduce_sum(losses * weights), count


def smoothed_cross_entropy(labels, logits, weights, smoothing=0.0):
    """(sum over real targets of the label-smoothed cross-entropy, sum of weights), float32:
    (1 - e) * -log p(gold) + e * the mean over the vocabulary of -log p."""
    # float32: a log-softmax over the whole target vocabulary.
    log_probabilities = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    gold = -tf.reduce_sum(tf.one_hot(labels, tf.shape(logits)[-1], dtype=tf.float32) * log_probabilities, axis=-1)
    losses = (
        gold if not smoothing else (1.0 - smoothing) * gold - smoothing * tf.reduce_mean(log_probabilities, axis=-1)
    )
    return tf.reduce_sum(losses * weights), tf.reduce_sum(weights)
