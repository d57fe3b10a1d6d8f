"""amptrain.forked: when a worker may be forked after the import, and what a forked worker
gets (its exit status, its output, its environment, a signal's death)."""

import threading

import forked_cli  # tests/: a process forked after the import, as `amptrain launch` runs
import pytest

from amptrain import forked


def test_no_fork_when_turned_off_or_beside_another_thread(monkeypatch):
    monkeypatch.setenv("AMPTRAIN_FORK", "0")
    assert not forked.ready()
    monkeypatch.delenv("AMPTRAIN_FORK")
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not forked.ready()  # a lock that thread holds would stay held in the child
    finally:
        stop.set()
        thread.join()


# Run in a process that imported TensorFlow and ran no op (the tests' zygote), as the
# `amptrain` command is when `launch` or `bench` asks.
FORKS = r"""
import os, signal, sys, tempfile, time
from amptrain import forked

assert forked.ready(), "an import-only process should be able to fork"
out = tempfile.TemporaryFile("w+")

def work():
    print("child", os.environ["ANSWER"], os.getpid() == os.getsid(0))
    print("to stderr", file=sys.stderr)
    return 3

child = forked.start(work, {"ANSWER": "42"}, out.fileno())
assert child.wait(timeout=60) == 3, child.returncode
out.seek(0)
assert out.read().splitlines() == ["child 42 True", "to stderr"]
sleeper = forked.start(lambda: time.sleep(60), {}, out.fileno())
assert sleeper.poll() is None
sleeper.kill()
assert sleeper.wait(timeout=60) == -signal.SIGKILL
import tensorflow as tf
tf.constant(1.0) + 1  # the runtime starts: a child could not start its own
assert not forked.ready()
print("ok")
"""


@pytest.mark.slow
def test_a_forked_worker_exits_prints_and_dies_as_a_process_does():
    result = forked_cli.python(["-c", FORKS], timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
