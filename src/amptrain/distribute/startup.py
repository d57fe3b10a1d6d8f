"""A deadline on a cluster's start-up: every worker arrives within `runtime.startup_timeout`,
or the run stops in one line naming those that never did; SIGTERM and Ctrl-C stop it at once.

    with startup_watch(cluster, runtime.startup_timeout):
        placement = select_strategy(runtime, cluster)   # blocks until every worker registered

While MultiWorkerMirroredStrategy registers with its peers, the main thread waits inside
TensorFlow's C++ code holding Python's interpreter lock, so no Python signal handler and no
other Python thread runs until it returns; and TensorFlow's preemption notifier takes
SIGTERM over and only logs it (a SLURM step whose second task never started waited 13.5
minutes, its SIGTERM logged and ignored; TensorFlow's own registration timeout did not end
it either). So the deadline is kept by a small watcher process, a fresh Python without
TensorFlow: at the deadline it probes each peer's port to name those that are not there,
says so on stderr and ends the run with SIGKILL (nothing was trained yet: nothing is lost).
It is in the run's process group, so a SIGTERM or SIGINT sent to the group (Ctrl-C at a
terminal, SLURM's scancel) reaches it too and ends the run at once; until TensorFlow takes
SIGTERM over, it ends the run by itself (the kernel's default action). The watcher leaves
as soon as start-up is over (its stdin closes), or when the run ends.
"""

import contextlib
import json
import signal
import subprocess
import sys
import threading

# The watcher: a fresh Python with no TensorFlow, given (parent pid, seconds, addresses, own index).
WATCHER = r"""
import json, os, select, signal, socket, sys
parent, seconds, addresses, me = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])

def stop(message):
    sys.stderr.write(f"amptrain: error: cluster start-up: {message}\n")
    sys.stderr.flush()
    os.kill(parent, signal.SIGKILL)  # SIGTERM is TensorFlow's by now, and only logged
    os._exit(0)

for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, lambda n, _: stop(f"stopped by {signal.Signals(n).name} before training began"))
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if ready:
    sys.exit(0)  # start-up ended (stdin closed): nothing to do
missing = []
for index, address in enumerate(addresses):
    if index == me:
        continue
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
    except (OSError, ValueError):
        missing.append(f"worker {index} ({address})")
who = ", ".join(missing) if missing else "a worker that listens but never registered"
stop(
    f"not every worker arrived within runtime.startup_timeout = {seconds:g} s; never arrived: {who}. "
    "Start every task of the step, or raise runtime.startup_timeout"
)
"""


@contextlib.contextmanager
def startup_watch(cluster, timeout):
    """Watches the `with` block (a multi-worker start-up) for `timeout` seconds, SIGTERM and
    SIGINT ending it at once; a no-op for one worker or off the main thread."""
    if not cluster.is_multi_worker or threading.current_thread() is not threading.main_thread():
        yield
        return
    import os

    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    for number in handlers:
        signal.signal(number, signal.SIG_DFL)
    args = [str(os.getpid()), str(timeout), json.dumps(list(cluster.addresses)), str(cluster.index)]
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, *args], stdin=subprocess.PIPE)
    try:
        yield
    finally:
        watcher.stdin.close()  # start-up is over: the watcher leaves
        watcher.wait()
        for number, handler in handlers.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
