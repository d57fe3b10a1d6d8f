"""A `tf.data` pipeline that serves a batch plan: one padded batch a step, prefetched.

    dataset = plan_dataset(plan, build_batch, signature, start_step=120)

`build_batch(indices, padded_length)` turns the plan's indices into numpy arrays; the
plan fixes the order, so starting at `start_step` is the whole of resuming.
"""

import tensorflow as tf


def plan_dataset(plan, build_batch, signature, start_step=0, num_steps=None):
    """Batches `start_step`, `start_step + 1`, ... of `plan` (forever if `num_steps` is None)."""

    def generate():
        step = start_step
        while num_steps is None or step < start_step + num_steps:
            indices, length = plan.batch(step)
            yield build_batch(indices, length)
            step += 1

    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.prefetch(tf.data.AUTOTUNE)
