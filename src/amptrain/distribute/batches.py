"""Each replica's share of the global batch, and the checks that the replicas can share it.

Batches: a task's dataset yields *global* batches (`train.batch_size` rows). Each is cut
into `num_replicas` equal slices, in order, and replica r of the whole cluster takes
slice r (`distribute_batches`). Every worker follows the same batch plan and builds only
its own replicas' rows of each batch (a task that cannot builds it whole and keeps its
slices), so every replica runs the same number of steps whatever the data (uneven shards
would leave a collective waiting forever), and the examples of a step are those of the
same step on one device: with the engine's loss contract (sums and counts all-reduced),
the update does not depend on the replica count.
"""

from amptrain.errors import ConfigError


def check_batch_size(batch_size, strategy):
    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ConfigError(
            f"train.batch_size: expected a multiple of the {replicas} replicas (it is the global batch, split evenly), "
            f"received {batch_size}; try {max(replicas, batch_size // replicas * replicas)} or "
            f"{-(-batch_size // replicas) * replicas}"
        )


def check_split(config, strategy, task=None):
    """Refuses a global batch the replicas cannot share, naming the sizes that would work:
    `train.batch_size` without `task` (before any work), token batches, whose rows depend on
    the bucket lengths the data gives, with the prepared `task`."""
    tokens = config.data.tokens_per_batch
    if not tokens and task is None:
        check_batch_size(config.train.batch_size, strategy)
    elif tokens and task is not None:
        check_token_batches(task.train_buckets(), tokens, strategy)


def check_token_batches(bucket_rows, tokens_per_batch, strategy):
    """Under data.tokens_per_batch every bucket's rows (a multiple of 8 where 8 fit,
    `data.batching.rows_for_tokens`) must split evenly over the replicas too;
    `bucket_rows`: (length, rows) a bucket."""
    replicas = strategy.num_replicas_in_sync
    uneven = [(length, rows) for length, rows in bucket_rows if rows % replicas]
    if not uneven:
        return
    length, rows = max(uneven)
    if 8 % replicas:
        fix = (
            "a token batch has a multiple of 8 rows where 8 fit: use a replica count that divides 8, "
            "or batch by rows (train.batch_size, without data.tokens_per_batch)"
        )
    else:
        fix = f"raise it to at least {8 * length}, so that every bucket's batches have a multiple of 8 rows"
    raise ConfigError(
        f"data.tokens_per_batch: every batch must split evenly over the {replicas} replicas, but "
        f"{tokens_per_batch} tokens give batches of {rows} rows of {length} pieces; {fix}"
    )


def distribute_batches(strategy, make_dataset, sharded=False):
    """A distributed dataset whose replica r gets slice r of each global batch that
    `make_dataset()` yields (see the module docstring). `sharded`: `make_dataset(share)`
    builds only part `share[0]` of `share[1]` of each global batch's rows, each worker
    (input pipeline) its own replicas' part."""
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return strategy.experimental_distribute_dataset(make_dataset(None) if sharded else make_dataset())
    import tensorflow as tf

    def dataset_fn(context):
        per_pipeline = replicas // context.num_input_pipelines
        first = context.input_pipeline_id * per_pipeline
        if sharded and context.num_input_pipelines > 1:
            # This worker's rows only: its replicas are slices 0.. of what it builds.
            share = (context.input_pipeline_id, context.num_input_pipelines)
            return _replica_slices(make_dataset(share), per_pipeline, 0, per_pipeline)
        made = make_dataset(None) if sharded else make_dataset()
        return _replica_slices(made, replicas, first, per_pipeline)

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def _replica_slices(dataset, parts, first, count):
    """Each batch of `dataset` cut into `parts` equal slices of rows, slices `first` to
    `first + count - 1` of each, one element a slice, in order."""
    import tensorflow as tf

    def slices(*element):
        def mine(tensor):
            shape = tf.shape(tensor)
            rows = tf.reshape(tensor, tf.concat([[parts, shape[0] // parts], shape[1:]], axis=0))
            return rows[first : first + count]

        return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(mine, element))

    return dataset.flat_map(slices).prefetch(tf.data.AUTOTUNE)
