"""`runtime.profile_steps = [first, last]`: a trace of those steps for TensorBoard's
profile plugin (`tensorboard-plugin-profile`), in `run_dir/tensorboard/plugins/profile`.

    profiler = StepProfiler.from_config(config.runtime, "runs/x/tensorboard")   # None when off
    profiler.before_call(step, n)   # starts the trace if the call's steps n meet the range
    profiler.after_call(step)       # stops it once `last` has run
    for thread, name, picoseconds in host_events(logdir): ...   # read a trace back

A graph call runs up to `steps_per_execution` steps and cannot be cut, so the traced range
is rounded out to whole calls, and the log says which steps were traced. When profiling is
off the loop holds no profiler: nothing is added to the graph or to a step.
"""

import logging

from amptrain.engine.run_log import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


class StepProfiler:
    def __init__(self, first, last, logdir):
        self.first, self.last, self.logdir = first, last, logdir
        self.traced_from = None  # the first step of the trace, once started
        self.done = False

    @classmethod
    def from_config(cls, runtime, logdir):
        """From the `[runtime]` section's `profile_steps`; None when it names none."""
        steps = runtime.profile_steps
        return cls(steps[0], steps[1], logdir) if steps else None

    def before_call(self, step, n):
        """`step`: steps done before the call; it runs steps step+1 .. step+n."""
        if self.done or self.traced_from is not None or not (step < self.last and step + n >= self.first):
            return
        import tensorflow as tf

        tf.profiler.experimental.start(self.logdir)
        self.traced_from = step + 1

    def after_call(self, step):
        if self.traced_from is not None and not self.done and step >= self.last:
            self.stop(step)

    def stop(self, step):
        """Ends the trace at `step` (the run may end before `last`)."""
        if self.traced_from is None or self.done:
            return
        import tensorflow as tf

        tf.profiler.experimental.stop()
        self.done = True
        why = ""
        if step < self.last:
            why = f" (runtime.profile_steps {self.first}..{self.last}: the run ended at step {step})"
        elif (self.traced_from, step) != (self.first, self.last):
            why = (
                f" (runtime.profile_steps {self.first}..{self.last}, rounded out to whole graph calls of up to "
                "runtime.steps_per_execution steps)"
            )
        logger.info(f"profiled steps {self.traced_from}..{step} into {self.logdir}/plugins/profile{why}")


def host_events(logdir):
    """(thread line, event name, duration in picoseconds) of each event on the host CPU
    plane of the newest trace under `logdir` (`plugins/profile/<run>/*.xplane.pb`, as
    `StepProfiler` and `tf.profiler.experimental.start(logdir)` write it), read with
    TensorFlow's own XPlane reader. TensorFlow ops are named "<node name>:<op type>"."""
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = sorted(glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb"))[-1:]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    host = next(plane for plane in space.planes if plane.name == "/host:CPU")
    for line in host.lines:
        for event in line.events:
            yield line.name, host.event_metadata[event.metadata_id].name, event.duration_ps
