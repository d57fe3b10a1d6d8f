"""Files written whole or not at all: the run folder's records, the probe's cache."""

import os


def atomic_write(path, text):
    """Writes `text` to `path` through a temporary file and a rename: a crash leaves the old
    file or the new one, never half of one."""
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(temporary, path)
