"""The files a run learned from its training split (vocabulary, labels), checked before use.

    record(run_dir, ["labels.json", "vocab.txt"])   # once, when fit has learned them
    check(run_dir)                                   # eval, predict, export, a resume: refuses a changed file

The checkpoints index their embedding rows and output classes by these files: a vocabulary
shuffled or a label list reordered keeps every shape and scores nonsense without an error
(accuracy 0.24 for two swapped labels). So `fit` records each file's SHA-256 in
`RUN_DIR/learned.json` (as `pretrained.json` does for pretrained weights) and every later
reader compares before it builds a model.
"""

import json
import os

from amptrain.errors import CheckpointError, UserError
from amptrain.files import sha256

RECORD_FILE = "learned.json"


def names(task):
    """The files `task` learns into its run folder (`TextTask.learned_files`; none for a task
    that does not say)."""
    listed = getattr(task, "learned_files", None)
    return list(listed()) if callable(listed) else []


def record(run_dir, names):
    """Writes the SHA-256 of each of `names` present in `run_dir` into `learned.json`, unless
    it is there already (a resume checks it with `check` instead)."""
    from amptrain.files import atomic_write

    path = os.path.join(run_dir, RECORD_FILE)
    if os.path.exists(path):
        return
    present = [name for name in names if os.path.isfile(os.path.join(run_dir, name))]
    hashes = {name: sha256(os.path.join(run_dir, name)) for name in present}
    atomic_write(path, json.dumps({"sha256": hashes}, indent=1) + "\n")


def check(run_dir):
    """Refuses, in one line naming the file, a learned file that is missing or differs from
    what `record` saw. A run folder without `learned.json` (made before it existed) passes."""
    path = os.path.join(run_dir, RECORD_FILE)
    if not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            hashes = json.load(f)["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path}: damaged ({error}); expected the SHA-256 of the run's learned files") from None
    for name, expected in hashes.items():
        file = os.path.join(run_dir, name)
        if not os.path.isfile(file):
            raise UserError(f"{file}: missing; the run's checkpoints were trained with it (its sha256 is in {path})")
        found = sha256(file)
        if found != expected:
            raise UserError(
                f"{file}: changed since the run learned it (sha256 {found[:12]}…, recorded {expected[:12]}… in "
                f"{path}); its checkpoints index this file's entries, so put the original back or train a new run"
            )


def describe(run_dir, names):
    """'vocab.txt: 200 lines, labels.json: 2 labels' of the files present: what a model built
    from the run folder is sized by."""
    parts = []
    for name in names:
        file = os.path.join(run_dir, name)
        try:
            if name.endswith(".json"):
                with open(file, encoding="utf-8") as f:
                    parts.append(f"{name}: {len(json.load(f))} entries")
            else:
                with open(file, encoding="utf-8", errors="replace") as f:
                    parts.append(f"{name}: {sum(1 for line in f if line.strip())} lines")
        except (OSError, ValueError, TypeError):
            continue
    return ", ".join(parts)


def explain_mismatch(error, checkpoint, run_dir, names):
    """A CheckpointError for a restore that failed on a variable's shape: which variable, the
    two shapes, and the learned files the model was sized by."""
    lines = [line.strip() for line in str(error).splitlines() if "incompatible" in line or "shape" in line]
    detail = lines[0] if lines else str(error).splitlines()[0]
    sized = describe(run_dir, names)
    return CheckpointError(
        f"{checkpoint}: its weights do not fit the model built from the run folder's learned files"
        f"{f' ({sized})' if sized else ''}: {detail[:300]}; a learned file changed since the checkpoint was "
        "saved: put the original back, or train a new run"
    )
