"""`amptrain launch --workers N CONFIG`: a multi-worker run on this machine.

    amptrain launch --workers 2 configs/classify-spam.toml --set train.steps=200

Starts N `amptrain fit` processes, each with its own TF_CONFIG naming all N on free
localhost ports (worker 0 is the chief, the only one that writes the run folder), and
prints their output line by line, each line prefixed `[worker i]`. On Linux the workers are
forked from the launcher once it has imported TensorFlow, Keras and amptrain (and run no
TensorFlow op, so each worker starts a runtime of its own): the import, several seconds of
CPU and most of a worker's memory before it trains, is paid once and its pages are shared.
Elsewhere, when this process has started TensorFlow's runtime or a thread already, or with
`AMPTRAIN_FORK=0`, each worker is a new `python -m amptrain fit`. Exits with the first
failing worker's status (0 when all succeed). When a worker fails, the others are given
`runtime.collective_timeout` plus a margin to notice (a dead peer stops their collectives
with a message naming it), then stopped with SIGTERM, which checkpoints and exits.

On a real cluster, set TF_CONFIG on every host yourself and run `amptrain fit` there.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from amptrain import forked

# Seconds beyond runtime.collective_timeout that the launcher waits for the other workers
# after one failed, before it stops them.
GRACE = 30.0


def free_ports(count):
    """`count` distinct ports free on localhost now (a tiny race remains until workers bind)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("localhost", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_configs(ports):
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(len(ports))]


def launch(config_path, workers, overrides=(), run_dir=None, overwrite=False, stream=sys.stdout, main=None):
    """Runs the workers to the end; returns the exit status (0, or the first failure's).
    `main`: the `amptrain` command's main, which a forked worker runs (the CLI passes it);
    without it every worker is a new Python."""
    from amptrain import api
    from amptrain import config as config_lib
    from amptrain.errors import ConfigError

    if workers < 2:
        raise ConfigError(f"--workers: expected 2 or more (for one process use `amptrain fit`), received {workers}")
    config = config_lib.load_config(config_path, overrides)  # a config error stops here, once
    run_dir = os.path.abspath(run_dir or os.path.join(api.RUNS_DIR, os.path.splitext(os.path.basename(config_path))[0]))
    args = ["fit", os.path.abspath(config_path), "--run-dir", run_dir]
    for item in overrides:
        args += ["--set", item if isinstance(item, str) else f"{item[0]}={json.dumps(item[1])}"]
    if overwrite:
        args.append("--overwrite")  # only the chief acts on it
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    fork = main is not None and forked.ready(preload)  # the import first: the ports are taken as late as they can be
    ports = free_ports(workers)
    print(
        f"launching {workers} workers on localhost ports {', '.join(map(str, ports))}; run folder {run_dir}",
        file=stream,
    )
    processes = [
        fork_worker(main, args, {**env, "TF_CONFIG": c}) if fork else exec_worker(args, {**env, "TF_CONFIG": c})
        for c in tf_configs(ports)
    ]
    print(
        f"[launch] workers {', '.join(f'{i}: pid {p.pid}' for i, p in enumerate(processes))}"
        f" ({'forked after the import' if fork else 'each a new Python'})",
        file=stream,
        flush=True,
    )
    lock = threading.Lock()  # the pumps start after the last fork: a forked worker inherits no thread
    pumps = []
    for index, process in enumerate(processes):
        pump = threading.Thread(target=_pump, args=(process.stdout, f"[worker {index}] ", stream, lock), daemon=True)
        pump.start()
        pumps.append(pump)
    try:
        status = _wait(processes, config.runtime.collective_timeout + GRACE, stream, lock)
    except KeyboardInterrupt:
        _stop(processes, signal.SIGINT)
        status = 130
    for pump in pumps:
        pump.join(timeout=5)
    return status


def preload():
    """What every worker's `fit` imports beyond TensorFlow and Keras (forked.IMPORTS),
    imported once by the launcher before it forks them."""
    import amptrain.api  # noqa: F401
    import amptrain.engine.step_runner  # noqa: F401
    import amptrain.tasks  # noqa: F401


def exec_worker(args, env):
    """A worker that is a new Python: `python -m amptrain ARGS`."""
    return subprocess.Popen(
        [sys.executable, "-m", "amptrain", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # a Ctrl-C reaches them through us, once
    )


def fork_worker(main, args, env):
    """A worker forked from this process that runs the CLI's `main` on ARGS as `python -m
    amptrain ARGS` would after its import (forked.py); its output on a pipe, `.stdout`."""
    read, write = os.pipe()
    worker = forked.start(lambda: _as_program(main, args), env, stdout=write)
    os.close(write)
    worker.stdout = os.fdopen(read, "r", errors="replace")
    return worker


def _as_program(main, args):
    sys.argv = ["amptrain", *args]
    return main()  # no argv: the program's own path (its quiet start-up, sys.argv read)


def _pump(pipe, prefix, stream, lock):
    for line in pipe:
        with lock:
            stream.write(prefix + line if line.endswith("\n") else prefix + line + "\n")
            stream.flush()


def _wait(processes, grace, stream, lock):
    first_failure = None
    failed_at = None
    while True:
        codes = [p.poll() for p in processes]
        for index, code in enumerate(codes):
            if code not in (None, 0) and first_failure is None:
                first_failure, failed_at = (index, code), time.time()
                with lock:
                    print(
                        f"[launch] worker {index} exited with status {_describe(code)}; waiting up to {grace:.0f} s "
                        "for the others",
                        file=stream,
                        flush=True,
                    )
        if all(code is not None for code in codes):
            break
        if failed_at is not None and time.time() - failed_at > grace:
            with lock:
                print("[launch] stopping the remaining workers", file=stream, flush=True)
            _stop(processes, signal.SIGTERM)
        time.sleep(0.2)
    if first_failure is None:
        return 0
    code = first_failure[1]
    return code if code > 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it


def _describe(code):
    if code < 0:
        try:
            return f"{128 - code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return str(128 - code)
    return str(code)


def _stop(processes, signum):
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:  # a forked worker not yet in a session of its own
                os.kill(process.pid, signum)
    deadline = time.time() + 30
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
