"""Choosing the `tf.distribute` strategy, and what a run needs to know about its cluster.

    cluster = Cluster.from_env()                  # TF_CONFIG: which worker am I? (no TensorFlow)
    configure_devices(config.runtime)             # before TensorFlow starts: cpu_replicas
    placement = select_strategy(config.runtime, cluster)   # .strategy, .name, .why
    with placement.strategy.scope(): model = ...
    iterator = iter(distribute_batches(strategy, lambda: dataset_of_global_batches))
    barrier(strategy)                             # every worker has reached this line

One concept a module: `cluster` (TF_CONFIG), `devices` (logical CPU devices, device
names), `strategy` (the choice, the coordination service, the TPU), `batches` (each
replica's slice of the global batch and the checks that it splits), `collectives` (the
barrier, naming a lost peer). The names are re-exported here, so `distribute.X` works.
None of these modules imports TensorFlow at import time.
"""

from amptrain.distribute.batches import check_batch_size, check_split, check_token_batches, distribute_batches
from amptrain.distribute.cluster import Cluster
from amptrain.distribute.collectives import barrier, explain_lost_peer
from amptrain.distribute.devices import configure_devices
from amptrain.distribute.strategy import (
    HEARTBEAT_TIMEOUT,
    Placement,
    _configure_coordination,
    is_single_device,
    select_strategy,
)

__all__ = [
    "HEARTBEAT_TIMEOUT",
    "Cluster",
    "Placement",
    "_configure_coordination",
    "barrier",
    "check_batch_size",
    "check_split",
    "check_token_batches",
    "configure_devices",
    "distribute_batches",
    "explain_lost_peer",
    "is_single_device",
    "select_strategy",
]
