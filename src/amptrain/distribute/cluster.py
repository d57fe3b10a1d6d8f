"""The cluster a run belongs to, as TF_CONFIG describes it (or a scheduler, written as
TF_CONFIG: `schedulers.py`); reading it needs no TensorFlow."""

import dataclasses
import json
import os

from amptrain.distribute.schedulers import scheduler_tf_config
from amptrain.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Cluster:
    """This process's place in a multi-worker cluster, read from TF_CONFIG."""

    num_workers: int = 1
    index: int = 0  # among the workers, the chief first
    task_type: str = "worker"
    addresses: tuple = ()  # host:port of each worker, in `index` order
    source: str = ""  # where it was read: "TF_CONFIG", "SLURM" or "Kubernetes"

    @property
    def is_chief(self):
        return self.index == 0

    @property
    def is_multi_worker(self):
        return self.num_workers > 1

    @classmethod
    def from_env(cls, environ=os.environ, source="auto"):
        """This process's cluster by `runtime.cluster = source`. One a scheduler describes
        is written into `environ` as TF_CONFIG, which TensorFlow's strategy reads too."""
        built, origin = scheduler_tf_config(source, environ)
        if built is not None:
            environ["TF_CONFIG"] = json.dumps(built)
        elif origin != "TF_CONFIG":
            return cls()
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
        return cls(len(addresses), index, task_type, addresses, origin)

    def name(self, index=None):
        index = self.index if index is None else index
        address = f" ({self.addresses[index]})" if index < len(self.addresses) else ""
        return f"worker {index}{address}"
