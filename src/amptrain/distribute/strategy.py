"""Choosing the `tf.distribute` strategy: `runtime.strategy`, or for "auto" what the
environment offers (a cluster in TF_CONFIG, a TPU, several GPUs or logical CPUs); the
coordination service a multi-worker strategy needs, and the TPU connection."""

import dataclasses
import os

from amptrain.distribute.cluster import Cluster
from amptrain.distribute.devices import _devices, _split
from amptrain.errors import ConfigError, UserError


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
            "cluster": cluster.source or None,  # where the workers came from: TF_CONFIG, SLURM, Kubernetes
        }


# A process's MultiWorkerMirroredStrategy: it must exist before TensorFlow runs an op and can
# be made once, so a user's script makes it first (`amptrain.configure_devices`) and the run
# takes that one.
_MULTI_WORKER = []


def select_strategy(runtime, cluster=None):
    """The Placement for `runtime.strategy`; "auto" picks from the environment."""
    import tensorflow as tf

    cluster = cluster or Cluster.from_env(source=runtime.cluster)
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
        if not _MULTI_WORKER:
            _configure_coordination(runtime)
            options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=runtime.collective_timeout)
            _MULTI_WORKER.append(tf.distribute.MultiWorkerMirroredStrategy(communication_options=options))
        strategy = _MULTI_WORKER[0]
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
        cluster_register_timeout_in_ms=int(runtime.startup_timeout * 1000),
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


def is_single_device(strategy):
    """True for TensorFlow's default strategy and `OneDeviceStrategy`: one replica, whose
    `merge_call` is a plain call, so XLA can compile a step's optimizer update along with
    its forward and backward pass (MirroredStrategy's cannot be: its replicas run in
    threads that meet in `merge_call`)."""
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib  # the default strategy's class is private

    return isinstance(strategy, tf.distribute.OneDeviceStrategy) or strategy is distribute_lib._get_default_strategy()
