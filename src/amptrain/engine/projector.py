"""The token embeddings for TensorBoard's projector, written with the best checkpoint.

    write_projector(run_dir + "/tensorboard/train", [Projection("tokens", table, pieces, counts)], max_rows=10000)

A task says what to project (`Task.projections(model)`, tuples of a `Projection`'s fields):
each embedding table with the vocabulary's pieces and, where known, each piece's count in
the training data. They go into the
`train` run's folder of `RUN/tensorboard`, where the projector plugin looks for them (a
config is read only from a folder of event files or the log root, and a run folder without
one borrows its parent's checkpoint without its labels): `projector_config.pbtxt`, the
latest TensorFlow checkpoint of the tables (`checkpoint`, `projector-embeddings-N.*`, found
through the `checkpoint` file, so the run folder may move) and `projector-NAME.tsv` a
table, one line a row, in the vocabulary's order, with a header line only when it has two
columns (piece, count), as TensorBoard reads it. At most `max_rows` rows a table
(`train.projector_rows`): the most frequent pieces where the counts are known, else the
first ones, so that a 250,000-piece vocabulary does not write a gigabyte.
"""

import dataclasses
import os
import unicodedata

import numpy as np

from amptrain.files import atomic_write

CONFIG_FILE = "projector_config.pbtxt"
CHECKPOINT = "projector-embeddings"


@dataclasses.dataclass
class Projection:
    name: str  # "tokens"; translation's "source" and "target"
    table: object  # (vocabulary, width) array or variable
    pieces: list  # the vocabulary in id order (at least the table's rows it names)
    counts: object = None  # each piece's count in the training data, or None


def rows_kept(projection, max_rows):
    """The ids written: all, or the `max_rows` most frequent (else the first), in id order."""
    rows = min(int(np.shape(projection.table)[0]), len(projection.pieces))
    if rows <= max_rows:
        return np.arange(rows)
    if projection.counts is None:
        return np.arange(max_rows)
    counts = np.asarray(projection.counts)[:rows]
    return np.sort(np.argsort(-counts, kind="stable")[:max_rows])


def write_projector(tensorboard_dir, projections, max_rows):
    """Writes these tables for the projector into `tensorboard_dir` (the train run's folder),
    replacing the last ones;
    returns the config's path (None: nothing to write)."""
    if not projections or max_rows <= 0:
        return None
    import tensorflow as tf
    from tensorboard.plugins import projector

    os.makedirs(tensorboard_dir, exist_ok=True)
    config = projector.ProjectorConfig()
    variables = {}
    for projection in projections:
        projection = Projection(*projection) if isinstance(projection, tuple) else projection
        ids = rows_kept(projection, max_rows)
        table = np.asarray(tf.convert_to_tensor(projection.table), np.float32)[ids]
        variables[projection.name] = tf.Variable(table, name=projection.name, trainable=False)
        metadata = f"projector-{projection.name}.tsv"
        _write_metadata(
            os.path.join(tensorboard_dir, metadata), [projection.pieces[i] for i in ids], projection.counts, ids
        )
        embedding = config.embeddings.add()
        embedding.tensor_name = f"{projection.name}/.ATTRIBUTES/VARIABLE_VALUE"
        embedding.metadata_path = metadata
    checkpoint = tf.train.Checkpoint(**variables)
    tf.train.CheckpointManager(checkpoint, tensorboard_dir, max_to_keep=1, checkpoint_name=CHECKPOINT).save()
    path = os.path.join(tensorboard_dir, CONFIG_FILE)
    atomic_write(path, str(config))  # the text format TensorBoard parses
    return path


UNSEEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # control, format, unassigned; line and paragraph breaks


def cell(piece):
    """A piece as one cell: a backslash, a tab, a line break or any other control or separator
    character (a byte piece such as form feed) written as its Python escape."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if ch == "\\" or unicodedata.category(ch) in UNSEEN else ch
        for ch in str(piece)
    )


def _write_metadata(path, pieces, counts, ids):
    if counts is None:
        lines = [cell(piece) + "\n" for piece in pieces]
    else:
        lines = ["piece\tcount\n"] + [f"{cell(piece)}\t{int(counts[i])}\n" for piece, i in zip(pieces, ids)]
    atomic_write(path, "".join(lines))
