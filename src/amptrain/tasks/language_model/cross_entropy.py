"""The cross-entropy over a large vocabulary without the logits of a whole batch: the tied
output embedding's logits are made a chunk of positions at a time, and each chunk is reduced
to what the loss and its gradient need before the next one is made.

    total = summed_cross_entropy(states, table, labels)   # scalar; its gradient reaches both
    total = summed_cross_entropy(states, table, labels, table_gradient=False, products="bfloat16")
    losses = token_cross_entropy(states, table, labels)   # (rows,), no gradient, in float32

`states` (rows, hidden) and `table` (vocabulary, hidden) are float32; `labels` (rows,) int32,
negative where a position is not scored (as `labels = -100` in Hugging Face's models).

At batch 32 × 256 positions × 4,096 pieces the logits alone are 128 MiB in float32, and a
plain `log_softmax` + gather keeps them, their log-softmax and their gradient (three such
tensors) for the backward pass: more than every block's activations together. Here a chunk
holds `CHUNK_ELEMENTS` logits (32 MiB of float32) at most. The gradient is made in the
forward pass (softmax minus the one-hot label, times the table and the states), as
Liger-Kernel's fused linear cross-entropy does: the backward pass only scales it, so nothing
is computed twice. That needs the upstream gradient to be one number, hence a summed loss
for training. A frozen table (LoRA's base) gets no gradient: neither its product (2 FLOPs a
table weight and a position) nor its float32 sum is made.

Training's products run in `products`: the network's bfloat16 under `mixed_bfloat16` (as
keras-hub's and transformers' heads do under it), with the softmax, its sums and the loss in
float32; in a training step (`runtime.fused_kernels`, the default) a chunk's softmax is one
XLA computation (`xla_modes.kernel`: max, exp, sum, log and the gradient in one pass over
the logits, not eight), elsewhere the same ops. On SmolLM2's 49,152 pieces at 8 × 128
positions this takes the head and loss from 1.16 s a step to 0.34 (AMX CPU,
`benchmarks/lm_head_loss.py`). Scoring (`token_cross_entropy`) stays in float32 throughout.
"""

import tensorflow as tf

from amptrain.xla_modes import kernel

CHUNK_ELEMENTS = 1 << 23  # float32 logits held at once: 32 MiB


def chunk_rows(vocabulary_size):
    return max(1, CHUNK_ELEMENTS // max(1, int(vocabulary_size)))


def summed_cross_entropy(states, table, labels, table_gradient=True, products=tf.float32):
    """Σ -log softmax(states · tableᵀ)[label] over the scored rows, with its gradient (the
    table's only with `table_gradient`)."""

    @tf.custom_gradient
    def fused(states, table):
        total, d_states, d_table = _chunks(states, table, labels, True, table_gradient, products)

        def gradient(upstream):
            return upstream * d_states, None if d_table is None else upstream * d_table

        return total, gradient

    return fused(states, table)


def token_cross_entropy(states, table, labels):
    """-log softmax(states · tableᵀ)[label] of every row (0 where not scored)."""
    return _chunks(states, table, labels, gradients=False)


@kernel
def _softmax_gradient(logits, kept, weight, products):
    """(losses, d logits) of a chunk: -log softmax at `kept` and softmax minus its one-hot,
    each row times `weight` (0 where not scored); the gradient in `products`."""
    top = tf.reduce_max(logits, axis=-1, keepdims=True)
    e = tf.exp(logits - top)
    total = tf.reduce_sum(e, axis=-1)
    picked = tf.gather(logits, kept, batch_dims=1)
    losses = weight * (top[:, 0] + tf.math.log(total) - picked)
    d_logits = e * (weight / total)[:, None] - tf.one_hot(kept, tf.shape(logits)[1]) * weight[:, None]
    return losses, tf.cast(d_logits, products)


def _chunks(states, table, labels, gradients, table_gradient=True, products=tf.float32):
    rows = tf.shape(states)[0]
    hidden = tf.shape(states)[1]
    size = chunk_rows(table.shape[0] if table.shape[0] is not None else 1 << 16)
    count = (rows + size - 1) // size
    padding = count * size - rows
    states_3 = tf.reshape(tf.pad(states, [[0, padding], [0, 0]]), [count, size, hidden])
    labels_2 = tf.reshape(tf.pad(labels, [[0, padding]], constant_values=-1), [count, size])
    products = products if gradients else tf.float32  # scores in float32
    table_p = tf.cast(table, products)  # once a call, not a chunk

    def one(index):
        chunk, gold = tf.cast(states_3[index], products), labels_2[index]
        logits = tf.cast(tf.matmul(chunk, table_p, transpose_b=True), tf.float32)  # (size, vocabulary)
        scored = gold >= 0
        kept = tf.where(scored, gold, 0)
        if not gradients:
            normalizer = tf.reduce_logsumexp(logits, axis=-1)
            return tf.where(scored, normalizer - tf.gather(logits, kept, batch_dims=1), 0.0), None, None
        losses, d_logits = _softmax_gradient(logits, kept, tf.cast(scored, tf.float32), products)
        d_table = None
        if table_gradient:
            d_table = tf.cast(tf.matmul(d_logits, chunk, transpose_a=True), tf.float32)
        return losses, tf.cast(tf.matmul(d_logits, table_p), tf.float32), d_table

    if not gradients:
        out = tf.TensorArray(tf.float32, size=count, element_shape=[size])

        def body(index, out):
            return index + 1, out.write(index, one(index)[0])

        _, out = tf.while_loop(lambda index, _: index < count, body, (0, out), parallel_iterations=1)
        return tf.reshape(out.stack(), [-1])[:rows]

    d_states = tf.TensorArray(tf.float32, size=count, element_shape=[size, states.shape[1]])

    def body(index, total, d_states, *d_table):  # d_table: the table's sum so far, if it has a gradient
        losses, d_chunk, d_table_chunk = one(index)
        summed = (d_table[0] + d_table_chunk,) if table_gradient else ()
        return index + 1, total + tf.reduce_sum(losses), d_states.write(index, d_chunk), *summed

    start = (0, tf.constant(0.0), d_states, *((tf.zeros_like(table),) if table_gradient else ()))
    _, total, d_states, *d_table = tf.while_loop(lambda index, *_: index < count, body, start, parallel_iterations=1)
    return total, tf.reshape(d_states.stack(), [-1, hidden])[:rows], d_table[0] if table_gradient else None
