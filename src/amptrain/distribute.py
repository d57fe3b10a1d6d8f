"""Choosing the `tf.distribute` strategy, and what a run needs to know about its cluster.

    cluster = Cluster.from_env()                  # TF_CONFIG: which worker am I? (no TensorFlow)
    configure_devices(config.runtime)             # before TensorFlow starts: cpu_replicas
    placement = select_strategy(config.runtime, cluster)   # .strategy, .name, .why
    with placement.strategy.scope(): model = ...
    iterator = iter(distribute_batches(strategy, lambda: dataset_of_global_batches))
    barrier(strategy)                             # every worker has reached this line

Batches: a task's dataset yields *global* batches (`train.batch_size` rows). Each is cut
into `num_replicas` equal slices, in order, and replica r of the whole cluster takes
slice r (`distribute_batches`). Every worker builds the same batch plan and keeps only
its own replicas' slices, so every replica runs the same number of steps whatever the
data (uneven shards would leave a collective waiting forever), and the examples of a
step are those of the same step on one device: with the engine's loss contract (sums
and counts all-reduced), the update does not depend on the replica count.
"""

import dataclasses
import json
import os
import re

from amptrain.errors import ConfigError, UserError


@dataclasses.dataclass(frozen=True)
class Cluster:
    """This process's place in a multi-worker cluster, read from TF_CONFIG."""

    num_workers: int = 1
    index: int = 0  # among the workers, the chief first
    task_type: str = "worker"
    addresses: tuple = ()  # host:port of each worker, in `index` order

    @property
    def is_chief(self):
        return self.index == 0

    @property
    def is_multi_worker(self):
        return self.num_workers > 1

    @classmethod
    def from_env(cls, environ=os.environ):
        raw = environ.get("TF_CONFIG", "")
        if not raw.strip():
            return cls()
        try:
            spec = json.loads(raw)
            cluster = spec.get("cluster") or {}
            task = spec.get("task") or {}
            task_type, task_index = task.get("type", "worker"), int(task.get("index", 0))
        except (ValueError, AttributeError, TypeError) as error:
            raise ConfigError(
                f"TF_CONFIG: expected JSON with 'cluster' and 'task', received {raw!r} ({error})"
            ) from None
        # TensorFlow's order: the chief (if named) is worker 0 of the collective group.
        addresses = tuple(cluster.get("chief", [])) + tuple(cluster.get("worker", []))
        if not addresses:
            return cls()
        if task_type not in ("chief", "worker"):
            raise ConfigError(f"TF_CONFIG: task type {task_type!r} is not supported; expected chief or worker")
        index = task_index if task_type == "chief" else len(cluster.get("chief", [])) + task_index
        if not 0 <= index < len(addresses):
            raise ConfigError(f"TF_CONFIG: task {task_type} {task_index} is not in the cluster {cluster}")
        return cls(len(addresses), index, task_type, addresses)

    def name(self, index=None):
        index = self.index if index is None else index
        address = f" ({self.addresses[index]})" if index < len(self.addresses) else ""
        return f"worker {index}{address}"


def configure_devices(runtime):
    """Splits the CPU into `runtime.cpu_replicas` logical devices. Must run before
    TensorFlow initialises its devices (anything that runs an op does)."""
    if runtime.cpu_replicas <= 1:
        return
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration()] * runtime.cpu_replicas
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) == len(wanted):
        return
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
    except RuntimeError:
        raise ConfigError(
            f"runtime.cpu_replicas = {runtime.cpu_replicas}: TensorFlow has already started in this process with "
            f"{len(tf.config.list_logical_devices('CPU'))} CPU device(s); logical devices can only be set before it "
            "runs anything (run `amptrain fit` in a fresh process)"
        ) from None


@dataclasses.dataclass(frozen=True)
class Placement:
    strategy: object  # a tf.distribute.Strategy
    name: str  # one_device | mirrored | multi_worker | tpu
    why: str  # what chose it

    def describe(self, cluster):
        """The `run` record's fields."""
        return {
            "strategy": self.name,
            "strategy_reason": self.why,
            "num_replicas": self.strategy.num_replicas_in_sync,
            "num_workers": cluster.num_workers,
        }


def select_strategy(runtime, cluster=None):
    """The Placement for `runtime.strategy`; "auto" picks from the environment."""
    import tensorflow as tf

    cluster = cluster or Cluster.from_env()
    name = runtime.strategy
    why = f"runtime.strategy = {name!r}"
    if name == "auto":
        name, why = _auto(runtime, cluster)
    if name == "multi_worker":
        if not cluster.is_multi_worker:
            raise ConfigError(
                "runtime.strategy = 'multi_worker': expected TF_CONFIG to name a cluster of 2 or more workers, "
                f"received {os.environ.get('TF_CONFIG', '') or 'no TF_CONFIG'} (`amptrain launch --workers N` sets it)"
            )
        _configure_coordination(runtime)
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=runtime.collective_timeout)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    elif name == "tpu":
        strategy = _tpu_strategy(runtime)
    elif name == "mirrored":
        strategy = tf.distribute.MirroredStrategy(_devices(runtime, default_all=True))
    else:
        devices = _devices(runtime, default_all=False)
        if len(devices) > 1:
            raise ConfigError(f"runtime.devices: expected one device for one_device, received {runtime.devices!r}")
        strategy = tf.distribute.OneDeviceStrategy(devices[0]) if runtime.devices else tf.distribute.get_strategy()
        name = "one_device"
    return Placement(strategy, name, why)


# Seconds without a heartbeat before a worker counts as lost. TensorFlow's default let a
# survivor wait 43 s here after its peer was killed; with 10 s it learns in about 10-20 s.
HEARTBEAT_TIMEOUT = 10


def _configure_coordination(runtime):
    """Sets up TensorFlow's coordination service the way MultiWorkerMirroredStrategy would
    (it keeps a service already configured), with two timeouts it leaves at their defaults:
    the heartbeat timeout (how soon a dead peer is noticed) and the registration timeout (a
    worker that never starts makes the others fail after `runtime.collective_timeout`
    instead of waiting forever). TensorFlow has no public API for these."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return
    spec = TFConfigClusterResolver().cluster_spec()
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=HEARTBEAT_TIMEOUT * 1000,
        cluster_register_timeout_in_ms=int(runtime.collective_timeout * 1000),
        coordinated_jobs=jobs,
    )


def _auto(runtime, cluster):
    import tensorflow as tf

    if cluster.is_multi_worker:
        return "multi_worker", f"TF_CONFIG names {cluster.num_workers} workers"
    if runtime.tpu or _tpu_hinted():
        return "tpu", "a TPU is named or attached"
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1 and not runtime.devices:
        return "mirrored", f"{len(gpus)} GPUs"
    if runtime.devices and len(_split(runtime.devices)) > 1:
        return "mirrored", f"runtime.devices names {len(_split(runtime.devices))}"
    if runtime.cpu_replicas > 1:
        return "mirrored", f"runtime.cpu_replicas = {runtime.cpu_replicas}"
    return "one_device", "one device"


def _split(devices):
    return [d.strip() for d in devices.split(",") if d.strip()]


def _devices(runtime, default_all):
    """The device names to use: `runtime.devices`, else every GPU, else the CPU(s)."""
    import tensorflow as tf

    known = {
        d.name.lower().replace("/job:localhost/replica:0/task:0", ""): d.name for d in tf.config.list_logical_devices()
    }
    if runtime.devices:
        names = _split(runtime.devices)
        missing = [n for n in names if _normalise(n) not in known]
        if missing:
            raise ConfigError(
                f"runtime.devices: {', '.join(missing)} not found; "
                f"this machine has {', '.join(sorted(known)) or 'none'}"
            )
        return names
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if not default_all:
        return (gpus or cpus)[:1]
    return gpus or cpus


def _normalise(name):
    name = name.lower()
    return name if name.startswith("/device:") else "/device:" + name.lstrip("/")


def _tpu_hinted():
    return bool(os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR")) or os.path.exists("/dev/accel0")


def _tpu_strategy(runtime):
    """TPUStrategy through the same code path. Unverified on hardware (no TPU here)."""
    import tensorflow as tf

    if not (runtime.tpu or _tpu_hinted()):
        raise ConfigError(
            "runtime.strategy = 'tpu': no TPU named or attached; set runtime.tpu to its name or grpc:// address "
            '("local" on a TPU VM), or TPU_NAME'
        )
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=runtime.tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as error:
        raise UserError(f"runtime.tpu = {runtime.tpu!r}: could not connect to the TPU: {error}") from None
    return tf.distribute.TPUStrategy(resolver)


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
        check_token_batches(tuple(zip(task.boundaries, task.batch_rows())), tokens, strategy)


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


def distribute_batches(strategy, make_dataset):
    """A distributed dataset whose replica r gets slice r of each global batch that
    `make_dataset()` yields (see the module docstring)."""
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return strategy.experimental_distribute_dataset(make_dataset())
    import tensorflow as tf

    def dataset_fn(context):
        per_pipeline = replicas // context.num_input_pipelines
        first = context.input_pipeline_id * per_pipeline

        def slices(*element):
            def mine(tensor):
                shape = tf.shape(tensor)
                rows = tf.reshape(tensor, tf.concat([[replicas, shape[0] // replicas], shape[1:]], axis=0))
                return rows[first : first + per_pipeline]

            return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(mine, element))

        return make_dataset().flat_map(slices).prefetch(tf.data.AUTOTUNE)

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


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


def is_single_device(strategy):
    """True for TensorFlow's default strategy and `OneDeviceStrategy`: one replica, whose
    `merge_call` is a plain call, so XLA can compile a step's optimizer update along with
    its forward and backward pass (MirroredStrategy's cannot be: its replicas run in
    threads that meet in `merge_call`)."""
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib  # the default strategy's class is private

    return isinstance(strategy, tf.distribute.OneDeviceStrategy) or strategy is distribute_lib._get_default_strategy()
