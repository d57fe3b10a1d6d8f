"""Damaged checkpoints: the newest intact one is used, with a warning naming the damaged one;
never a silent start from step 0, never a crash while intact ones exist."""

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from amptrain.engine.checkpoints import Checkpoints, restore_weights
from amptrain.engine.run_folder.checkpoint_files import damage, step_prefixes
from amptrain.errors import CheckpointError


def make(directory, max_to_keep=5):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    return Checkpoints(str(directory), model, optimizer, step, max_to_keep=max_to_keep), model, step


@pytest.fixture
def saved(tmp_path):
    """Checkpoints at steps 10, 20, 30, the weights of step N all equal to N; best at 20."""
    checkpoints, model, step = make(tmp_path)
    for n in (10, 20, 30):
        step.assign(n)
        for v in model.trainable_variables:
            v.assign(tf.fill(v.shape, float(n)))
        checkpoints.save()
        if n == 20:
            checkpoints.save_best()
    return tmp_path


def restored(directory):
    checkpoints, model, _ = make(directory)
    step = checkpoints.restore_latest()
    assert all(np.all(v.numpy() == step) for v in model.trainable_variables)
    return step, checkpoints


def data_file(directory, n):
    return str(directory / f"ckpt-{n}.data-00000-of-00001")


def test_a_missing_newest_index_resumes_from_the_one_before(saved, caplog):
    os.remove(saved / "ckpt-30.index")
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        step, checkpoints = restored(saved)
    assert step == 20
    assert "ckpt-30 is damaged (ckpt-30.index is missing)" in caplog.text
    assert os.path.exists(saved / "ckpt-10.index")  # nothing intact was deleted
    checkpoints.step.assign(30)  # training on replaces the damaged one
    checkpoints.save()
    assert damage(str(saved / "ckpt-30")) is None
    assert [os.path.basename(p) for p in step_prefixes(str(saved))] == ["ckpt-30", "ckpt-20", "ckpt-10"]


def test_a_truncated_newest_data_file_falls_back(saved, caplog):
    path = data_file(saved, 30)
    os.truncate(path, os.path.getsize(path) // 2)
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        assert restored(saved)[0] == 20
    assert "ckpt-30 is damaged (ckpt-30 does not read back" in caplog.text


def test_flipped_bytes_are_found_by_the_checksums(saved):
    path = data_file(saved, 30)
    with open(path, "r+b") as f:
        f.seek(8)
        byte = f.read(1)
        f.seek(8)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert "does not read back" in damage(str(saved / "ckpt-30"))
    assert restored(saved)[0] == 20


def test_an_empty_state_file_is_rebuilt_from_the_files(saved):
    (saved / "checkpoint").write_text("")
    assert restored(saved)[0] == 30


def test_no_intact_checkpoint_is_one_line_error_not_a_fresh_start(saved):
    for n in (10, 20, 30):
        os.remove(saved / f"ckpt-{n}.index")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as error:
        make(saved)[0].restore_latest()
    assert "\n" not in str(error.value)


def test_a_truncated_best_checkpoint_falls_back_to_the_newest_intact_one(saved, caplog):
    best = str(saved / "best" / "ckpt-20.data-00000-of-00001")
    os.truncate(best, os.path.getsize(best) // 2)
    model = make(saved / "elsewhere")[1]
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        path = restore_weights(model, str(saved))
    assert os.path.basename(path) == "ckpt-30" and np.all(model.trainable_variables[0].numpy() == 30)
    assert "best" in caplog.text and "ckpt-20" in caplog.text
