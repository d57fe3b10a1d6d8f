"""Worker processes forked after the import instead of started as new Pythons.

    if forked.ready(preload):                   # imports TensorFlow, Keras, ... and calls preload() first
        worker = forked.start(lambda: main(["fit", ...]), env, stdout=fd)
        code = worker.wait()                    # as Popen.wait: -N when killed by signal N

A new `python -m amptrain` spends several seconds of CPU importing TensorFlow, Keras,
keras-hub and TensorFlow Text before it does anything, and holds most of its memory in what
it imported. A child forked from a process that has imported them skips that and shares
those pages. It is safe only while the parent has started none of what cannot be forked:
TensorFlow's runtime (a child must start its own, with its own devices, collectives and
TF_CONFIG), its device listing (CUDA, which it initialises, does not survive a fork), or
another thread (a lock it holds would stay held in the child). `ready` checks all three
after the import, so a caller falls back to a new Python when it says no: not Linux, a
program that has trained already, or `AMPTRAIN_FORK=0` in the environment.
"""

import atexit
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

FORK_ENV = "AMPTRAIN_FORK"  # "0": never fork, start every worker as a new Python
IMPORTS = ("tensorflow", "keras", "keras_hub", "tensorflow_text")  # what every worker imports


def ready(preload=None):
    """Whether a worker can be forked from this process: on Linux, one thread, and
    TensorFlow's runtime neither started nor its devices listed, checked after importing
    IMPORTS and calling `preload` (a function importing what the worker needs beyond them)."""
    if sys.platform != "linux" or os.environ.get(FORK_ENV) == "0" or threading.active_count() > 1:
        return False
    for name in IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional one: the worker imports what it needs itself
            pass
    if preload is not None:
        preload()
    from tensorflow.python.eager import context  # no public API tells whether the runtime started

    runtime = context.context()
    return runtime._context_handle is None and runtime._physical_devices is None and threading.active_count() == 1


def start(run, env, stdout, stderr=None):
    """Forks a child that runs `run()` (its return value the exit status, as a program's
    `main`) with `env` as its environment, in a session of its own, its output on the file
    descriptors `stdout` and `stderr` (default: stdout's). The caller closes its copies."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(run, env, stdout, stdout if stderr is None else stderr)  # never returns
    return Forked(pid)


def _child(run, env, stdout, stderr):
    code = 1
    try:
        os.setsid()  # a Ctrl-C reaches it through its parent, once, as with start_new_session
        for signum, handler in (
            (signal.SIGTERM, signal.SIG_DFL),
            (signal.SIGCHLD, signal.SIG_DFL),
            (signal.SIGPIPE, signal.SIG_IGN),  # as a new Python sets them
            (signal.SIGINT, signal.default_int_handler),
        ):
            signal.signal(signum, handler)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        sys.stdout = open(1, "w", buffering=1, errors="backslashreplace", closefd=False)  # a line at a time
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # TMPDIR is read again
        code = run()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            atexit._run_exitfuncs()  # what a normal exit runs (os._exit alone skips it)
        finally:
            os._exit(code if isinstance(code, int) else 0)


class Forked:
    """A forked child as its parent sees it, the part of a Popen's interface that the
    launcher and bench use: pid, returncode, poll(), wait(timeout), kill()."""

    def __init__(self, pid, stdout=None):
        self.pid, self.stdout, self.returncode = pid, stdout, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N: killed by signal N
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked worker (pid {self.pid})", timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self):
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
