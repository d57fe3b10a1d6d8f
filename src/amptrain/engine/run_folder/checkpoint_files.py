"""Which checkpoints in a folder are whole: every checkpoint is read back before it is trusted.

    step_prefixes("runs/x/checkpoints")     # ["runs/x/checkpoints/ckpt-260", ...], newest first
    damage("runs/x/checkpoints/ckpt-260")   # None, or what is wrong ("ckpt-260.index is missing")
    prefix = newest_intact("runs/x/checkpoints")   # warns about each damaged newer one

TensorFlow's layout is kept (`ckpt-N.index`, `ckpt-N.data-*`, the `checkpoint` state file),
so its own tools read our folders. But TensorFlow trusts the state file: a missing newest
`.index` made `tf.train.latest_checkpoint` answer None (a resume then started from step 0
and rotated the intact checkpoints away), a truncated `.data` file raised `IndexError: Read
less bytes than requested` at restore, and an empty state file a `ValueError`. Here the
candidates come from the files on disk, newest first, and one is used only once every
tensor in it has been read back: TensorFlow checks each tensor's CRC32C against the index as
it reads it, so a truncated or flipped file fails there, not halfway through a restore.
"""

import glob
import logging
import os
import re

from amptrain.files import atomic_write

logger = logging.getLogger("amptrain")

_FILE = re.compile(r"^(?P<name>.+)-(?P<step>\d+)\.(?:index|data-(?P<shard>\d+)-of-(?P<shards>\d+))$")


def step_prefixes(directory, name="ckpt"):
    """The prefixes of the checkpoints `directory` has files of, newest (highest step) first."""
    steps = set()
    for path in glob.glob(os.path.join(glob.escape(directory), f"{name}-*")):
        match = _FILE.match(os.path.basename(path))
        if match and match["name"] == name:
            steps.add(int(match["step"]))
    return [os.path.join(directory, f"{name}-{step}") for step in sorted(steps, reverse=True)]


def damage(prefix):
    """None when the checkpoint at `prefix` reads back whole, else what is wrong with it."""
    import tensorflow as tf

    base = os.path.basename(prefix)
    if not os.path.exists(prefix + ".index"):
        return f"{base}.index is missing"
    shards = glob.glob(glob.escape(prefix) + ".data-*-of-*")
    if not shards:
        return f"{base} has no .data file"
    expected = int(_FILE.match(os.path.basename(shards[0]))["shards"])
    missing = [i for i in range(expected) if not os.path.exists(f"{prefix}.data-{i:05d}-of-{expected:05d}")]
    if missing:
        return f"{base}.data-{missing[0]:05d}-of-{expected:05d} is missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)
    except Exception as error:  # a damaged file fails in many ways: DataLossError, IndexError, ...
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"{base} does not read back: {first_line[:200]}"
    return None


def newest_intact(directory, name="ckpt", purpose="resuming"):
    """The newest checkpoint of `directory` that reads back whole, or None when there is
    none at all. Each damaged newer one is named in a warning; when every one is damaged,
    `CheckpointError` says so (never a silent start from nothing)."""
    from amptrain.errors import CheckpointError

    damaged = []
    for prefix in step_prefixes(directory, name):
        problem = damage(prefix)
        if problem is None:
            for bad, why in damaged:
                logger.warning(
                    f"checkpoint {os.path.basename(bad)} is damaged ({why}); {purpose} from "
                    f"{os.path.basename(prefix)}, the newest intact one"
                )
            return prefix
        damaged.append((prefix, problem))
    if damaged:
        raise CheckpointError(
            f"{directory}: no intact checkpoint to use for {purpose}; "
            + "; ".join(why for _, why in damaged)
            + " (remove the folder, or pass --overwrite, to start afresh)"
        )
    return None


def repair_state_file(directory, prefixes):
    """Rewrites `directory`'s `checkpoint` state file to list `prefixes` (oldest first, the
    last the newest): TensorFlow's `CheckpointManager` reads it to know what to rotate, and an
    empty or stale one makes it fail or count damaged checkpoints as kept ones."""
    path = os.path.join(directory, "checkpoint")
    if not prefixes:
        if os.path.exists(path):
            os.remove(path)
        return
    # TensorFlow's CheckpointState in its text format, paths relative to the folder.
    names = [os.path.basename(p) for p in prefixes]
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    atomic_write(path, "\n".join(lines) + "\n")


def readable_state(directory):
    """True when `directory`'s state file is absent or TensorFlow can read it."""
    import tensorflow as tf

    if not os.path.exists(os.path.join(directory, "checkpoint")):
        return True
    try:
        tf.train.get_checkpoint_state(directory)
        return True
    except Exception:  # empty, truncated or garbage: text_format raises ParseError, TF a ValueError
        return False
