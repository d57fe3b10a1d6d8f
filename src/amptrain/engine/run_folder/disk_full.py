"""A full disk as one line: what failed, the last intact checkpoint, what to free.

    except Exception as error:
        raise disk_full.explain(error, run_dir) or error

TensorFlow reports a full disk as an `OpError` whose message holds "No space left on
device" ([Op:SaveV2], 79 lines of traceback), Python as an `OSError` with ENOSPC. Either
leaves the run as it was at its last intact checkpoint, so a rerun with space resumes; a
half-saved checkpoint's `_temp` folder is removed (`remove_temporaries`) so it takes no
space and confuses no reader.
"""

import errno
import glob
import os
import shutil

from amptrain.errors import UserError

NO_SPACE = "No space left on device"


def is_disk_full(error):
    return (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or NO_SPACE in str(error)


def remove_temporaries(directory):
    """Removes what a save cut short left in a checkpoint folder: TensorFlow's `<prefix>_temp`
    folders and the state file's temporaries."""
    for path in glob.glob(os.path.join(glob.escape(directory), "*_temp*")) + glob.glob(
        os.path.join(glob.escape(directory), "*.tmp*")
    ):
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


def explain(error, run_dir):
    """A UserError for `error` if it is a full disk (else None), naming the last intact
    checkpoint of `run_dir`; removes the `_temp` folders a cut-short save left (of the
    checkpoints, and of the projector's embeddings)."""
    if not is_disk_full(error):
        return None
    from amptrain.engine.run_folder.checkpoint_files import newest_intact

    checkpoints = os.path.join(run_dir, "checkpoints")
    # The projector's embeddings are a checkpoint too, saved beside TensorBoard's events.
    projector = os.path.join(run_dir, "tensorboard", "train")
    for directory in (checkpoints, os.path.join(checkpoints, "best"), projector):
        if os.path.isdir(directory):
            remove_temporaries(directory)
    try:
        latest = newest_intact(checkpoints)
    except UserError:
        latest = None
    filename = getattr(error, "filename", None)
    what = f"writing {filename}" if filename else _operation(error)
    kept = f"the last intact checkpoint is {latest}" if latest else "no checkpoint was saved yet"
    free = shutil.disk_usage(run_dir).free if os.path.isdir(run_dir) else 0
    return UserError(
        f"{run_dir}: no space left on device ({what}); {kept}; free space on that disk "
        f"({free / 2**20:.1f} MiB free now) and rerun the same command to resume"
    )


def _operation(error):
    """What was being written: TensorFlow's op ("SaveV2": a checkpoint), else the error's type."""
    message = str(error)
    if "[Op:" in message:
        op = message.rsplit("[Op:", 1)[1].split("]", 1)[0]
        return "writing a checkpoint" if op.startswith(("Save", "MergeV2")) else f"TensorFlow's {op}"
    return type(error).__name__
