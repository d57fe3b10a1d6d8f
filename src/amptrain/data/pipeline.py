"""A `tf.data` pipeline that serves a batch plan: one padded batch a step, prefetched.

    dataset = plan_dataset(plan, build_batch, signature, start_step=120)

`build_batch(indices, padded_length)` turns the plan's indices into numpy arrays; the
plan fixes the order, so starting at `start_step` is the whole of resuming. With
`share=(part, parts)` only that part of each global batch's rows is built (a worker's
replicas' rows: `distribute/batches.py`), so a worker reads only its own examples.
"""

import tensorflow as tf


def plan_dataset(plan, build_batch, signature, start_step=0, num_steps=None, share=None):
    """Batches `start_step`, `start_step + 1`, ... of `plan` (forever if `num_steps` is None);
    of each, part `share[0]` of `share[1]` equal parts of its rows (None: all)."""

    def generate():
        step = start_step
        while num_steps is None or step < start_step + num_steps:
            indices, length = plan.batch(step)
            if share is not None:
                part, parts = share
                rows = len(indices) // parts
                indices = indices[part * rows : (part + 1) * rows]
            yield build_batch(indices, length)
            step += 1

    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.prefetch(tf.data.AUTOTUNE)
