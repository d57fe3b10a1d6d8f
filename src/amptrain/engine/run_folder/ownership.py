"""What in a run folder is amptrain's: the only files `fit` ever deletes.

    claim(run_dir)      # before anything is written: marks the folder, or refuses in one line
    empty(run_dir)      # --overwrite, or the retry of a start that never trained: ours only

A user may point `--run-dir` at a folder that holds their own files (`--run-dir .` beside
the config and the corpus). Emptying it must not take them: a run folder is emptied only
of the names amptrain writes (`OWN`, `OWN_PATTERNS`), and only once the folder carries the
mark `claim` leaves (`MARKER`). A folder without the mark that holds something with one of
amptrain's names is refused, naming it: its `config.toml` or `checkpoints/` may be the
user's own, and `fit` would write over them; so whatever else a run folder holds, or is
given later under other names, is the user's and stays. A run folder made
before the mark existed is recognised by what only a run leaves (its saved config beside
its log or its metrics) and marked then.
"""

import fnmatch
import json
import logging
import os
import shutil

from amptrain.engine.run_folder.lock import LOCK_FILE
from amptrain.errors import UserError
from amptrain.files import atomic_write

logger = logging.getLogger("amptrain")

MARKER = ".amptrain-run.json"
# Every name `fit`, `eval`, `export` and `bench` write at a run folder's top; a test trains
# each task and checks that nothing else appears.
OWN = frozenset(
    {
        MARKER,
        LOCK_FILE,
        "config.toml",
        "train.log",
        "metrics.jsonl",
        "checkpoints",
        "tensorboard",
        "export",
        "export-onnx",
        "bench",
        "learned.json",
        "precision.json",
        "pretrained.json",
        "task-code.json",
        "data.json",
        "labels.json",
        "vocab.txt",
        "vocab-source.txt",
        "vocab-target.txt",
        "lowercase-words.json",
        "vocab.json",
        "merges.txt",
        "vocabulary-made-from.json",
    }
)
# Token files and their records, predictions, and atomic writes' temporaries.
OWN_PATTERNS = ("tokens-*.bin", "tokens-*.bin.*", "predictions-*", "*.tmp")
# What only a run leaves: a folder from before the mark with its config and one of these is a run.
_RUN_EVIDENCE = ("train.log", "metrics.jsonl", "learned.json", "precision.json")


def is_own_name(name):
    return name in OWN or any(fnmatch.fnmatchcase(name, pattern) for pattern in OWN_PATTERNS)


def is_marked(run_dir):
    """True when `run_dir` carries amptrain's mark; a damaged mark is refused in one line."""
    path = os.path.join(run_dir, MARKER)
    try:
        with open(path, encoding="utf-8") as f:
            mark = json.load(f)
        if not isinstance(mark, dict) or mark.get("made_by") != "amptrain":
            raise ValueError("no 'made_by': 'amptrain'")
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as error:
        raise UserError(
            f"{path}: damaged ({error}); expected amptrain's mark of a run folder "
            '({"made_by": "amptrain"}); remove it only if the folder holds nothing of yours'
        ) from None
    return True


def _is_old_run(entries):
    """A run folder written before the mark existed: its config beside what only a run leaves."""
    return "config.toml" in entries and any(name in entries for name in _RUN_EVIDENCE)


def claim(run_dir):
    """Makes `run_dir` (created if missing) a run folder amptrain may write into and later
    empty of its own files. A folder without the mark that holds entries with amptrain's
    names (and is not an older run folder) is refused in one line naming them."""
    os.makedirs(run_dir, exist_ok=True)
    if is_marked(run_dir):
        return
    entries = set(os.listdir(run_dir)) - {LOCK_FILE}  # the lock is this process's, taken just before
    if not _is_old_run(entries):
        clashing = sorted(name for name in entries if is_own_name(name))
        if clashing:
            raise UserError(
                f"{run_dir}: not a run folder amptrain made, and it holds {', '.join(clashing)}, which a run "
                "would write over; pass --run-dir an empty or new folder"
            )
    atomic_write(os.path.join(run_dir, MARKER), json.dumps({"made_by": "amptrain"}) + "\n")


def owned(run_dir):
    """The entries of `run_dir` amptrain wrote (never the lock nor the mark), sorted; none for
    a folder without the mark."""
    if not is_marked(run_dir):
        return []
    return sorted(name for name in os.listdir(run_dir) if is_own_name(name) and name not in (LOCK_FILE, MARKER))


def empty(run_dir):
    """Deletes what amptrain wrote into `run_dir` (its lock and mark stay); the user's entries
    stay, named in a log line. A folder without the mark is claimed first (or refused)."""
    if not os.path.isdir(run_dir):
        return
    claim(run_dir)
    for name in owned(run_dir):
        path = os.path.join(run_dir, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    kept = sorted(set(os.listdir(run_dir)) - {LOCK_FILE, MARKER})
    if kept:
        logger.info(f"{run_dir}: started afresh; kept what is not amptrain's: {', '.join(kept)}")
