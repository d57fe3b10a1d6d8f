"""One writer a run folder: an exclusive lock held by `fit` (and `eval`, which writes its log).

    with hold("runs/x", "fit"):      # UserError naming the holder's pid if another process has it
        ...

The lock is `fcntl.flock` on `RUN_DIR/.lock`: the kernel releases it when its process
exits, however it exits (a crash, SIGKILL), so a lock can never outlive its holder and
no stale lock blocks a rerun. The file keeps the holder's pid and command for the message
a second writer gets; a file left by a process that died is taken over with a warning.
Two `fit`s in one folder would otherwise both train, interleave `metrics.jsonl` and save
over each other's checkpoints.
"""

import contextlib
import fcntl
import logging
import os

from amptrain.errors import UserError

LOCK_FILE = ".lock"
logger = logging.getLogger("amptrain")


class RunLock:
    """The lock on one run folder; `release` (or the process's end) gives it up."""

    def __init__(self, run_dir, command):
        self.path = os.path.join(run_dir, LOCK_FILE)
        self.command = command
        self.file = None

    def acquire(self):
        run_dir = os.path.dirname(self.path)
        try:
            os.makedirs(run_dir, exist_ok=True)
            # "a+": never truncates the holder's pid before we know the lock is ours.
            self.file = open(self.path, "a+", encoding="utf-8")
        except OSError as error:
            raise UserError(
                f"{run_dir}: cannot write the run folder ({error.strerror}); pass --run-dir a folder you can write"
            ) from None
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(self.file)
            self.file.close()
            self.file = None
            raise UserError(
                f"{os.path.dirname(self.path)}: in use by {holder}; wait for it to end, "
                "or pass --run-dir another folder"
            ) from None
        previous = _read_holder(self.file)
        if previous != "another process" and not previous.startswith(f"pid {os.getpid()} "):
            logger.warning(f"{self.path}: taking over the lock of {previous}, which is no longer running")
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()} {self.command}\n")
        self.file.flush()
        return self

    def release(self):
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.seek(0)
                self.file.truncate()  # an empty file: released, not a dead holder
            fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def _read_holder(file):
    """'pid N (command)' from the lock file, or 'another process' when it holds nothing readable."""
    file.seek(0)
    pid, _, command = file.read().strip().partition(" ")
    return f"pid {pid} ({command or 'amptrain'})" if pid.isdigit() else "another process"


@contextlib.contextmanager
def hold(run_dir, command):
    """Holds the run folder's lock for the `with` block; refuses in one line if it is taken."""
    lock = RunLock(run_dir, command).acquire()
    try:
        yield lock
    finally:
        lock.release()
