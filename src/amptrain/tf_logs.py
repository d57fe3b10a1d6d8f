"""TensorFlow's start-up chatter kept off the terminal; its real warnings and errors kept on it.

    tf_logs.quiet()                       # a program's start, before TensorFlow is imported
    amptrain --verbose doctor             # or AMPTRAIN_TF_LOGS=1: everything TensorFlow prints

Why not TF_CPP_MIN_LOG_LEVEL alone: TensorFlow's C++ libraries log through absl, which
writes every message logged before `absl::InitializeLog()` to stderr whatever the level
(its preamble, then oneDNN's and the CUDA stub's INFO lines, twice: two of TensorFlow's
libraries carry an absl each). The `failed call to cuInit` ERROR of a machine without a
GPU comes at the first device listing, after logging is set up, and only level 3 would
hide it, and every real error with it. So while `tensorflow` is first imported and its
devices first listed, file descriptor 2 goes to a temporary file; then its lines go back
to stderr, less those that `is_noise` names. Level 1 stays the default: the INFO lines go,
TensorFlow's warnings stay. oneDNN stays on (TF_ENABLE_ONEDNN_OPTS=0 would slow bf16).
"""

import contextlib
import importlib.util
import logging
import os
import re
import sys
import tempfile

VERBOSE_ENV = "AMPTRAIN_TF_LOGS"  # "1": TensorFlow's logs unfiltered (children inherit it)

_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|port\.cc:\d+\] oneDNN custom operations are on"
)
_NO_DRIVER = re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers")
_CUINIT = re.compile(r"failed call to cuInit")


def verbose():
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def is_noise(lines):
    """Which of `lines` (TensorFlow's start-up output) are chatter: absl's preamble, the
    oneDNN notice, and, only when the CUDA stub found no driver, that notice and the
    cuInit failure it causes (with a driver, a failing cuInit is a real error and shows)."""
    no_driver = any(_NO_DRIVER.search(line) for line in lines)
    cuda_probe = re.compile(f"{_NO_DRIVER.pattern}|{_CUINIT.pattern}") if no_driver else None
    return [bool(_NOISE.search(line) or (cuda_probe and cuda_probe.search(line))) for line in lines]


def quiet():
    """Filters TensorFlow's start-up output from now on (once; a no-op when TensorFlow is
    already imported or the user asked for its logs)."""
    if verbose() or "tensorflow" in sys.modules or any(isinstance(f, _QuietImport) for f in sys.meta_path):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # INFO off; warnings and errors on
    sys.meta_path.insert(0, _QuietImport())


class _QuietImport:
    """A meta path finder for `tensorflow` alone: its loader runs the import (and the first
    device listing, where CUDA is probed) with stderr captured, then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once; find_spec below asks the other finders
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # resources and the like: the real loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with _CapturedStderr():
            self._loader.exec_module(module)
            module.config.list_physical_devices()  # cuInit happens here, once a process
        module.__loader__ = module.__spec__.loader = self._loader


class _CapturedStderr:
    """File descriptor 2 (C++ and Python alike) into a temporary file; on exit its lines,
    less the noise, written to the real stderr."""

    def __enter__(self):
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        lines = self._file.read().decode("utf-8", errors="replace").splitlines(keepends=True)
        self._file.close()
        kept = [line for line, noise in zip(lines, is_noise(lines)) if not noise]
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
        return False


@contextlib.contextmanager
def expected_retracing():
    """Drops TensorFlow's "triggered tf.function retracing" warning inside the block: for
    code that builds several trainers of the same methods on purpose (the precision probe's
    candidates), each traced once, which TensorFlow counts as retracing one function."""

    def keep(record):
        return "triggered tf.function retracing" not in record.getMessage()

    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addFilter(keep)
    try:
        yield
    finally:
        tf_logger.removeFilter(keep)
