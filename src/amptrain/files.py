"""Files written whole or not at all (the run folder's records, the probe's cache), and where
the per-user cache lives."""

import contextlib
import os
import tempfile


def atomic_write(path, text):
    """Writes `text` to `path` through a temporary file and a rename: a crash leaves the old
    file or the new one, never half of one."""
    # A temporary name of its own: two writers sharing `path + ".tmp"` would rename each
    # other's half-written file into place.
    folder, name = os.path.split(path)
    handle, temporary = tempfile.mkstemp(dir=folder or ".", prefix=name + ".", suffix=".tmp")
    try:
        os.fchmod(handle, 0o644)  # mkstemp's 0600 would stay on the file after the rename
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)  # a full disk leaves no temporary file behind
        raise


def cache_dir():
    """$AMPTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/amptrain, else ~/.cache/amptrain."""
    if os.environ.get("AMPTRAIN_CACHE_DIR"):
        return os.environ["AMPTRAIN_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "amptrain")


def sha256(path):
    """The SHA-256 of the file at `path`, read a MiB at a time."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(paths):
    """What a cached file was made from: each source's absolute path, size and SHA-256, in
    order. A cache is reused only while this is unchanged, never because it is newer."""
    return [{"path": os.path.abspath(p), "bytes": os.path.getsize(p), "sha256": sha256(p)} for p in paths]
