"""What the workers of a cluster do together outside a training step: meet at a barrier,
and, when a collective fails because a peer died or hung, say which peer."""

import re


def barrier(strategy):
    """Returns once every worker has called it (a no-op on one worker). No timeout: a
    worker may be busy for long before it gets here (the chief learning a vocabulary)."""
    if not isinstance(strategy, _multi_worker_types()):
        return
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=None)

    def arrive():
        return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0), options=options)

    strategy.reduce("sum", strategy.run(tf.function(arrive)), axis=None)


def _multi_worker_types():
    import tensorflow as tf

    return (tf.distribute.MultiWorkerMirroredStrategy,)


# Peers as TensorFlow names them: "/job:worker/replica:0/task:1".
_PEER = re.compile(r"/job:(worker|chief)/replica:\d+/task:(\d+)")


def explain_lost_peer(error, cluster):
    """A one-paragraph message for a collective that failed because a peer died or hung,
    naming the peer; None when `error` is something else.

    Seen here when a worker is killed: within a second or two the survivors' collective
    fails with UnavailableError "Collective ops is aborted by: recvmsg:Connection reset by
    peer ... from remote target /job:worker/replica:0/task:1", or, when the peer vanishes
    between collectives, with "The following tasks are unhealthy (stopped sending
    heartbeats): /job:worker/replica:0/task:1"."""
    import tensorflow as tf

    if not cluster.is_multi_worker or not isinstance(error, tf.errors.OpError):
        return None
    text = str(error)
    timed_out = isinstance(error, tf.errors.DeadlineExceededError) or "timed out" in text.lower()
    lost = isinstance(error, tf.errors.UnavailableError) or "Collective ops is aborted" in text or "unhealthy" in text
    if not (timed_out or lost):
        return None
    names = {(0 if kind == "chief" else int(index)) for kind, index in _PEER.findall(text)}
    peers = ", ".join(cluster.name(i) for i in sorted(names - {cluster.index})) or "a peer"
    if "unhealthy" in text:
        cause = f"lost {peers}: it stopped sending heartbeats (crashed, killed or unreachable)"
    elif lost:
        detail = re.search(r'grpc_message:"([^"]+)"', text)
        cause = f"lost {peers}: the connection to it failed" + (f" ({detail.group(1)})" if detail else "")
    else:
        cause = f"a collective timed out after runtime.collective_timeout waiting for {peers}"
    return (
        f"{cluster.name()} of {cluster.num_workers}: {cause}. Rerun the same command on every worker (or the same "
        "`amptrain launch`) to resume from the last checkpoint."
    )
