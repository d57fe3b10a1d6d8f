"""The devices a strategy runs on: logical CPU devices (`runtime.cpu_replicas`) and the
device names `runtime.devices` gives, checked against the machine's."""

from amptrain.errors import ConfigError


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
