"""The cross-entropy over a large vocabulary without the logits of a whole batch: the tied
output embedding's logits are made in float32 a chunk of positions at a time, and each chunk
is reduced to what the loss and its gradient need before the next one is made.

    total = summed_cross_entropy(states, table, labels)   # scalar; its gradient reaches both
    total = summed_cross_entropy(states, table, labels, table_gradient=False)  # a frozen table
    losses = token_cross_entropy(states, table, labels)   # (rows,), no gradient

`states` (rows, hidden) and `table` (vocabulary, hidden) are float32; `labels` (rows,) int32,
negative where a position is not scored (as `labels = -100` in Hugging Face's models).

At batch 32 × 256 positions × 4,096 pieces the logits alone are 128 MiB in float32, and a
plain `log_softmax` + gather keeps them, their log-softmax and their gradient (three such
tensors) for the backward pass: more than every block's activations together. Here a chunk
holds `CHUNK_ELEMENTS` logits (8 MiB) at most. The gradient is made in the forward pass
(softmax minus the one-hot label, times the table and the states), as Liger-Kernel's fused
linear cross-entropy does: the backward pass only scales it, so nothing is computed twice.
That needs the upstream gradient to be one number, hence a summed loss for training.
A frozen table (LoRA's base) gets no gradient: neither its product (2 FLOPs a table weight
and a position, a fifth of a LoRA step of SmolLM2) nor its float32 sum is made.
"""

import tensorflow as tf

CHUNK_ELEMENTS = 1 << 21  # float32 logits held at once: 8 MiB


def chunk_rows(vocabulary_size):
    return max(1, CHUNK_ELEMENTS // max(1, int(vocabulary_size)))


def summed_cross_entropy(states, table, labels, table_gradient=True):
    """Σ -log softmax(states · tableᵀ)[label] over the scored rows, with its gradient (the
    table's only with `table_gradient`)."""

    @tf.custom_gradient
    def fused(states, table):
        total, d_states, d_table = _chunks(states, table, labels, gradients=True, table_gradient=table_gradient)

        def gradient(upstream):
            return upstream * d_states, None if d_table is None else upstream * d_table

        return total, gradient

    return fused(states, table)


def token_cross_entropy(states, table, labels):
    """-log softmax(states · tableᵀ)[label] of every row (0 where not scored)."""
    return _chunks(states, table, labels, gradients=False)


def _chunks(states, table, labels, gradients, table_gradient=True):
    rows = tf.shape(states)[0]
    hidden = tf.shape(states)[1]
    size = chunk_rows(table.shape[0] if table.shape[0] is not None else 1 << 16)
    count = (rows + size - 1) // size
    padding = count * size - rows
    states_3 = tf.reshape(tf.pad(states, [[0, padding], [0, 0]]), [count, size, hidden])
    labels_2 = tf.reshape(tf.pad(labels, [[0, padding]], constant_values=-1), [count, size])

    def one(index):
        chunk, gold = states_3[index], labels_2[index]
        logits = tf.matmul(chunk, table, transpose_b=True)  # (size, vocabulary)
        scored = gold >= 0
        kept = tf.where(scored, gold, 0)
        normalizer = tf.reduce_logsumexp(logits, axis=-1)
        picked = tf.gather(logits, kept, batch_dims=1)
        losses = tf.where(scored, normalizer - picked, 0.0)
        if not gradients:
            return losses, None, None
        # d loss / d logits: softmax minus the one-hot label, on scored rows only
        d_logits = tf.exp(logits - normalizer[:, None]) - tf.one_hot(kept, tf.shape(logits)[1])
        d_logits *= tf.cast(scored, d_logits.dtype)[:, None]
        d_table = tf.matmul(d_logits, chunk, transpose_a=True) if table_gradient else None
        return losses, tf.matmul(d_logits, table), d_table

    if not gradients:
        out = tf.TensorArray(tf.float32, size=count, element_shape=[size])

        def body(index, out):
            return index + 1, out.write(index, one(index)[0])

        _, out = tf.while_loop(lambda index, _: index < count, body, (0, out), parallel_iterations=1)
        return tf.reshape(out.stack(), [-1])[:rows]

    d_states = tf.TensorArray(tf.float32, size=count, element_shape=[size, states.shape[1]])
    if not table_gradient:

        def frozen(index, total, d_states):
            losses, d_chunk, _ = one(index)
            return index + 1, total + tf.reduce_sum(losses), d_states.write(index, d_chunk)

        start = (0, tf.constant(0.0), d_states)
        _, total, d_states = tf.while_loop(lambda index, *_: index < count, frozen, start, parallel_iterations=1)
        return total, tf.reshape(d_states.stack(), [-1, hidden])[:rows], None

    def body(index, total, d_states, d_table):
        losses, d_chunk, d_table_chunk = one(index)
        return index + 1, total + tf.reduce_sum(losses), d_states.write(index, d_chunk), d_table + d_table_chunk

    start = (0, tf.constant(0.0), d_states, tf.zeros_like(table))
    _, total, d_states, d_table = tf.while_loop(lambda index, *_: index < count, body, start, parallel_iterations=1)
    return total, tf.reshape(d_states.stack(), [-1, hidden])[:rows], d_table
