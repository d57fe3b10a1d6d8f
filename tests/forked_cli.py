"""`amptrain ARGS` (or `python ARGV`: a script, `-c CODE`, `-m MODULE`) as a process of its
own that skips the import: forked from one process (cli_zygote.py) that imported TensorFlow
and amptrain once per pytest process. A tier of tests that starts a hundred commands pays
four to seven seconds of import for each otherwise.

    forked_cli.run(["fit", config])            # as subprocess.run: a CompletedProcess
    forked_cli.python([script, "--flag"])      # a user's script, as `python script --flag`
    process = forked_cli.start(["fit", config])  # as Popen: to kill, poll or communicate with

Only for tests about what a command does. A test about how a command starts (its first
lines, its environment at import, its hash seed) runs `python -m amptrain` itself."""

import json
import os
import subprocess
import sys
import tempfile
import threading

from amptrain import forked

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
    return start(args, env=env, cwd=cwd, folder=folder).finish(timeout)


def python(argv, env=None, cwd=None, timeout=600):
    """Like `subprocess.run([python, *argv], capture_output=True, text=True)` for a script's
    path, `-c CODE` or `-m MODULE` and their arguments, forked after the import."""
    return start(python=argv, env=env, cwd=cwd).finish(timeout)


def start(args=None, python=None, env=None, cwd=None, folder=None, output=None):
    """Like `subprocess.Popen` of `amptrain ARGS` (or `python PYTHON`) with stdout and stderr
    captured: a Forked, whose pid is the command's own, to signal, poll or communicate with.
    `output`: a file that both go to as they are written (as `stderr=STDOUT` into a file)."""
    folder = folder or tempfile.mkdtemp(prefix="amptrain-cli-")
    files = {name: os.path.join(folder, name) for name in ("stdout", "stderr", "status")}
    if output is not None:
        files["stdout"] = files["stderr"] = str(output)
    what = {"python": [str(a) for a in python]} if python is not None else {"args": [str(a) for a in args]}
    request = {**what, "env": {**os.environ, **(env or {})}, "cwd": str(cwd or os.getcwd()), **files}
    with _lock:  # one request at a time: the answers are lines on one pipe
        zygote = _start()
        zygote.stdin.write(json.dumps(request) + "\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline().split()[1])
    return Forked(pid, ["amptrain", *args] if python is None else ["python", *what["python"]], files)


class Forked(forked.Forked):
    """A forked command: pid, returncode, poll(), wait(timeout) and kill() as amptrain's
    forked workers have them, communicate(timeout) as a Popen's (text), finish(timeout) as
    subprocess.run's CompletedProcess. The zygote reaps it, so its exit status comes from
    the file it writes (none: killed, -9), not from waitpid."""

    def __init__(self, pid, args, files):
        super().__init__(pid)
        self.args, self.files = args, files

    def poll(self):
        if self.returncode is None and _gone(self.pid):
            status = _read(self.files["status"])
            self.returncode = int(status) if status else -9
        return self.returncode

    def communicate(self, timeout=None):
        self.wait(timeout)
        return _read(self.files["stdout"]), _read(self.files["stderr"])

    def finish(self, timeout):
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return subprocess.CompletedProcess(self.args, self.returncode, *self.communicate())

    def send_signal(self, signum):
        os.kill(self.pid, signum)


def _read(path):
    return open(path).read() if os.path.exists(path) else ""
