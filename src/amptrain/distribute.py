"""Choosing the `tf.distribute` strategy from the config and the environment.

    strategy = select_strategy(config.runtime)
    with strategy.scope(): model = ...
"""

import tensorflow as tf


def select_strategy(runtime_config):
    """Only the default (one device) strategy for now; mirrored and multi-worker come
    with the distribution work, and the engine already runs every step through
    `strategy.run` so they need no change there."""
    if runtime_config.strategy == "default":
        return tf.distribute.get_strategy()
    raise ValueError(f"unknown strategy {runtime_config.strategy!r}")


def describe(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    num_workers = 1
    if resolver is not None and resolver.cluster_spec().as_dict():
        num_workers = len(resolver.cluster_spec().as_dict().get("worker", [])) or 1
    return {
        "strategy": type(strategy).__name__,
        "num_replicas": strategy.num_replicas_in_sync,
        "num_workers": num_workers,
    }
