"""`amptrain ARGS` as a process of its own that skips the import: forked from one process
(cli_zygote.py) that imported TensorFlow and amptrain once per pytest process. A tier of
tests that starts a hundred commands pays seven seconds of import for each otherwise.

Only for tests about what a command does. A test about how a command starts (its first
lines, its environment at import) runs `python -m amptrain` itself."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_zygote = None


def _start():
    global _zygote
    if _zygote is None or _zygote.poll() is not None:
        source = os.path.join(HERE, "..", "src")
        path = os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2"}
        log = tempfile.NamedTemporaryFile("w+", prefix="cli-zygote-", suffix=".log", delete=False)
        _zygote = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "cli_zygote.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, env=env,
        )  # fmt: skip
        if _zygote.stdout.readline().strip() != "ready":
            raise RuntimeError(f"tests/cli_zygote.py did not start:\n{open(log.name).read()[-3000:]}")
    return _zygote


def _gone(pid):
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def run(args, env=None, cwd=None, timeout=600, folder=None):
    """Like `subprocess.run([python, -m, amptrain, *args], capture_output=True, text=True)`:
    a CompletedProcess; a command past `timeout` seconds is killed and raises TimeoutExpired."""
    folder = folder or tempfile.mkdtemp(prefix="amptrain-cli-")
    files = {name: os.path.join(folder, name) for name in ("stdout", "stderr", "status")}
    request = {
        "args": [str(a) for a in args],
        "env": {**os.environ, **(env or {})},
        "cwd": str(cwd or os.getcwd()),
        **files,
    }
    with _lock:  # one request at a time: the answers are lines on one pipe
        zygote = _start()
        zygote.stdin.write(json.dumps(request) + "\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline().split()[1])
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            raise subprocess.TimeoutExpired(["amptrain", *request["args"]], timeout)
        time.sleep(0.05)
    read = {name: open(path).read() if os.path.exists(path) else "" for name, path in files.items()}
    code = int(read["status"]) if read["status"] else -9  # no status: the child died (a signal)
    return subprocess.CompletedProcess(["amptrain", *request["args"]], code, read["stdout"], read["stderr"])
