"""SIGTERM as a flag for the whole of a fit: training, each evaluation and the final test.

    with sigterm_flag() as terminated:     # a threading.Event
        ...                                # the loop checks it after each graph call and evaluation

The handler only sets the flag: an exception raised wherever the signal lands (inside the
input generator TensorFlow calls back, halfway through writing a checkpoint) could leave
the process hanging instead of saving. It stays installed until the final test has been
written, so a SIGTERM during an evaluation or the final test is never dropped or left to
the default handler (which exits 143 saying nothing).

An interruption during (or just before) a dev evaluation leaves a checkpoint at that step
without its evaluation; `evaluation_missed` tells the resumed loop to do it first, so the
best checkpoint is the one an uninterrupted run picks.
"""

import contextlib
import os
import signal
import threading


@contextlib.contextmanager
def sigterm_flag():
    """An Event set by SIGTERM for the `with` block (signal handlers can only be set from the
    main thread: elsewhere the Event is never set and the default handling stays)."""
    terminated = threading.Event()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: terminated.set()) if in_main_thread else None
    try:
        yield terminated
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def evaluation_missed(checkpoints_source, step):
    """True when the chief's `metrics.jsonl` (beside `checkpoints_source`, the folder restores
    read from: every worker reads the same records) has no dev evaluation at `step`."""
    from amptrain.engine.run_log import read_metrics

    path = os.path.join(os.path.dirname(checkpoints_source), "metrics.jsonl")
    return not any(
        r.get("kind") == "eval" and r.get("split") == "dev" and r.get("step") == step for r in read_metrics(path)
    )
