"""The cluster from what a scheduler tells each process, written as the TF_CONFIG that
TensorFlow's MultiWorkerMirroredStrategy reads. No TensorFlow needed.

    tf_config, source = scheduler_tf_config("auto", os.environ)   # {"cluster": ..., "task": ...}, "SLURM"

`runtime.cluster` says where the cluster comes from:
- "auto" (default): TF_CONFIG when set (`amptrain launch`, Kubeflow's TFJob), else a SLURM
  step of several tasks, else a Kubernetes Indexed Job that names its workers' address;
  else none (one process).
- "tf_config", "slurm", "kubernetes": only that one (a missing variable is an error);
  "none": one process, whatever the environment says.

SLURM (`srun amptrain fit ...`): one worker a task. The nodes come from
SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), expanded (`node[01-03,7]`), their tasks from
SLURM_STEP_TASKS_PER_NODE (`2(x3),1`); the task's rank is SLURM_PROCID. Ranks are laid out
by node (`--distribution=block`, srun's default): worker r is on the node that holds rank r,
at port base + its local rank, so several tasks on one node do not collide; the base is
AMPTRAIN_PORT, else 20000 + 10 × (SLURM_JOB_ID mod 4000), which two jobs sharing a node
rarely share. TensorFlow's own SlurmClusterResolver counts GPUs with `nvidia-smi` and fails
without it (and with `gpus_per_node=0`), so it is not used.

Kubernetes, without the training operator: an Indexed Job (`completionMode: Indexed`) whose
pods find each other through a headless Service. Each pod gets JOB_COMPLETION_INDEX from
Kubernetes; the manifest sets AMPTRAIN_WORKERS (the Job's completions) and
AMPTRAIN_WORKER_ADDRESS, each worker's address with `{index}` (and `{port}`: AMPTRAIN_PORT,
default 2222, plus the index) in it, e.g. `amptrain-{index}.amptrain:{port}` (the pod's
hostname `JOB-INDEX` under the Service's subdomain).
"""

import re

from amptrain.errors import ConfigError

KUBERNETES_PORT = 2222


def scheduler_tf_config(source, environ):
    """(the TF_CONFIG to write, as a dict, or None; where the cluster comes from: "TF_CONFIG"
    (the one set, as it is), "SLURM", "Kubernetes" or None) for `runtime.cluster = source`."""
    if source == "none":
        return None, None
    if source in ("auto", "tf_config") and environ.get("TF_CONFIG", "").strip():
        return None, "TF_CONFIG"
    if source == "slurm" or source == "auto" and "SLURM_PROCID" in environ and "SLURM_JOB_ID" in environ:
        return slurm_tf_config(environ), "SLURM"
    if (
        source == "kubernetes"
        or source == "auto"
        and "JOB_COMPLETION_INDEX" in environ
        and ("AMPTRAIN_WORKER_ADDRESS" in environ)
    ):
        return kubernetes_tf_config(environ), "Kubernetes"
    if source == "tf_config":
        raise ConfigError("runtime.cluster = 'tf_config': TF_CONFIG is not set in this process's environment")
    return None, None


def slurm_tf_config(environ):
    """TF_CONFIG for this SLURM task, or None for a step of one task."""
    tasks = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks <= 1:
        return None
    nodes = expand_hostlist(_get(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    per_node = tasks_per_node(_get(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if len(per_node) == 1 and len(nodes) > 1:
        per_node = per_node * len(nodes)
    if len(per_node) != len(nodes) or sum(per_node) != tasks:
        raise ConfigError(
            f"SLURM: {len(nodes)} node(s) {nodes} with tasks per node {per_node} do not make the step's {tasks} tasks"
        )
    base = _port(environ, 20000 + 10 * (_int(environ, "SLURM_JOB_ID") % 4000))
    addresses = [f"{node}:{base + local}" for node, count in zip(nodes, per_node) for local in range(count)]
    rank = _int(environ, "SLURM_PROCID")
    if not 0 <= rank < tasks:
        raise ConfigError(f"SLURM_PROCID: expected 0 to {tasks - 1}, received {rank}")
    expected_local = int(addresses[rank].rsplit(":", 1)[1]) - base
    if "SLURM_LOCALID" in environ and _int(environ, "SLURM_LOCALID") != expected_local:
        raise ConfigError(
            f"SLURM: task {rank} has local id {environ['SLURM_LOCALID']}, but a block layout puts it at "
            f"{expected_local}; run srun with --distribution=block (its default)"
        )
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}


def kubernetes_tf_config(environ):
    """TF_CONFIG for this pod of an Indexed Job (see the module docstring)."""
    workers = _int(environ, "AMPTRAIN_WORKERS")
    index = _int(environ, "JOB_COMPLETION_INDEX")
    template = _get(environ, "AMPTRAIN_WORKER_ADDRESS")
    if "{index}" not in template and "{port}" not in template:  # else every worker had one address
        raise ConfigError(f"AMPTRAIN_WORKER_ADDRESS: expected '{{index}}' or '{{port}}' in it, received {template!r}")
    if not 0 <= index < workers:
        raise ConfigError(f"JOB_COMPLETION_INDEX: expected 0 to {workers - 1} (AMPTRAIN_WORKERS), received {index}")
    port = _port(environ, KUBERNETES_PORT)
    try:
        addresses = [template.format(index=i, port=port + i) for i in range(workers)]
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(
            f"AMPTRAIN_WORKER_ADDRESS: {template!r} does not format ({type(error).__name__}: {error}); "
            "expected a host with '{index}' and '{port}' only, e.g. 'amptrain-{index}.amptrain:{port}'"
        ) from None
    if workers <= 1:
        return None
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}


_NAME = r"[A-Za-z0-9._-]*"
_RANGES = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*"
_HOST = re.compile(rf"({_NAME})(?:\[({_RANGES})\]({_NAME}))?")


def expand_hostlist(text):
    """SLURM's compact node list, e.g. "node[01-03,7],gpu-a[1-2],solo", as node names in
    order. Anything else (`node[01-`, `node[a-b]`, a range running backwards) is refused in
    one line: a misread list would make workers wait for hosts that do not exist."""
    names, position = [], 0
    while position < len(text):
        match = _HOST.match(text, position)
        end = match.end() if match else position
        if not match or end == position or (end < len(text) and text[end] != ","):
            raise ConfigError(
                f"SLURM node list: cannot read {text!r} at character {end + 1}; expected names and "
                "bracketed ranges, e.g. 'node[01-03,7],gpu-a[1-2],solo'"
            )
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            names.append(prefix)
        for item in (ranges or "").split(",") if ranges else ():
            first, _, last = item.partition("-")
            if int(last or first) < int(first):
                raise ConfigError(f"SLURM node list: range {item!r} in {text!r} runs backwards")
            names += [
                f"{prefix}{number:0{len(first)}d}{suffix or ''}" for number in range(int(first), int(last or first) + 1)
            ]
        position = end + 1
    if not names or not all(names):
        raise ConfigError(f"SLURM node list: expected node names, received {text!r}")
    return names


def tasks_per_node(text):
    """SLURM's tasks per node, e.g. "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ConfigError(f"SLURM tasks per node: expected e.g. '2(x3),1', received {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _port(environ, default):
    """AMPTRAIN_PORT when set (a port number), else `default`."""
    if not environ.get("AMPTRAIN_PORT", "").strip():
        return default
    port = _int(environ, "AMPTRAIN_PORT")
    if not 1 <= port <= 65535:
        raise ConfigError(f"AMPTRAIN_PORT: expected a port from 1 to 65535, received {port}")
    return port


def _get(environ, *names):
    for name in names:
        if environ.get(name, "").strip():
            return environ[name].strip()
    raise ConfigError(f"{' or '.join(names)}: not set in this process's environment")


def _int(environ, *names):
    value = _get(environ, *names)
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{names[0]}: expected an integer, received {value!r}") from None
