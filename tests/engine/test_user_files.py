"""A run folder is the only thing `fit` deletes: a folder holding the user's config, corpus
and an unrelated file survives a failed fit, a rerun with another config and --overwrite."""

import json
import os
import shutil

import pytest
from tasks.test_language_model import write_tiny_corpus

import amptrain
from amptrain.engine.run_folder import ownership
from amptrain.engine.run_folder.lock import LOCK_FILE
from amptrain.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KJV = os.path.join(ROOT, "data", "lm-kjv")


def users_folder(tmp_path):
    """The user's folder: their config (tiny.toml), corpus (train.txt, dev.txt) and notes;
    returns (folder, {name: bytes})."""
    write_tiny_corpus(tmp_path)
    (tmp_path / "notes.md").write_text("mine\n")
    names = ("train.txt", "dev.txt", "tiny.toml", "notes.md")
    return tmp_path, {name: (tmp_path / name).read_bytes() for name in names}


def intact(folder, contents):
    return all((folder / name).read_bytes() == data for name, data in contents.items())


@pytest.mark.slow
def test_a_failed_fit_a_rerun_with_another_config_and_overwrite_leave_the_users_files(tmp_path):
    folder, contents = users_folder(tmp_path)
    with pytest.raises(UserError):  # fails before training: no such data file
        amptrain.fit(str(folder / "tiny.toml"), ["data.dev=missing.txt"], run_dir=str(folder))
    assert intact(folder, contents)
    amptrain.fit(str(folder / "tiny.toml"), ["train.steps=1"], run_dir=str(folder))  # another config: started afresh
    assert intact(folder, contents) and (folder / "checkpoints").is_dir()
    amptrain.fit(str(folder / "tiny.toml"), run_dir=str(folder), overwrite=True)
    assert intact(folder, contents)
    assert json.loads((folder / ownership.MARKER).read_text()) == {"made_by": "amptrain"}
    ownership.empty(str(folder))
    assert sorted(os.listdir(folder)) == sorted([*contents, ownership.MARKER, LOCK_FILE])


def test_overwrite_on_a_folder_that_is_not_a_run_deletes_nothing(tmp_path):
    folder, contents = users_folder(tmp_path)
    (folder / "config.toml").write_text("# the user's own\n")
    (folder / "checkpoints").mkdir()
    with pytest.raises(UserError, match=r"not a run folder amptrain made, and it holds checkpoints, config.toml"):
        amptrain.fit(str(folder / "tiny.toml"), run_dir=str(folder), overwrite=True)
    assert intact(folder, contents) and (folder / "config.toml").read_text() == "# the user's own\n"
    assert (folder / "checkpoints").is_dir() and not (folder / ownership.MARKER).exists()


def test_only_amptrains_names_are_emptied_even_those_added_after_the_claim(tmp_path):
    (tmp_path / "data.csv").write_text("y")
    ownership.claim(str(tmp_path))
    (tmp_path / "train.log").write_text("ours")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "later.txt").write_text("the user's, added during the run")
    assert ownership.owned(str(tmp_path)) == ["checkpoints", "train.log"]
    ownership.empty(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([ownership.MARKER, "data.csv", "later.txt"])


def test_a_run_folder_from_before_the_mark_is_recognised_and_a_damaged_mark_refused(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(os.path.join(ROOT, "tests", "old_runs", "classification"), old)
    (old / "notes.md").write_text("mine")
    ownership.empty(str(old))
    assert sorted(os.listdir(old)) == [ownership.MARKER, "notes.md"]
    (old / ownership.MARKER).write_text("[1, 2")
    with pytest.raises(UserError, match=r"\.amptrain-run\.json: damaged"):
        ownership.empty(str(old))


def test_export_overwrite_never_replaces_a_folder_that_is_not_an_export(tmp_path):
    from amptrain.exports import _claim

    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="is not an amptrain export"):
        _claim(str(target), overwrite=True)
    assert (target / "keep.txt").exists()


@pytest.mark.slow
def test_corpora_and_token_files_are_used_only_for_what_they_were_made_from(tmp_path):
    from amptrain.errors import DataError

    folder, _ = users_folder(tmp_path)
    good = (folder / "train.txt").read_text(encoding="utf-8")
    run = str(folder / "run")
    (folder / "train.txt").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"train.txt: nothing to learn a vocabulary from \(0 bytes"):
        amptrain.fit(str(folder / "tiny.toml"), run_dir=run)
    (folder / "train.txt").write_text(good, encoding="utf-8")  # fixed: learned again, trains
    amptrain.fit(str(folder / "tiny.toml"), run_dir=run)
    with open(os.path.join(KJV, "dev.txt"), encoding="utf-8") as f:
        (folder / "a.txt").write_text(f.read(3000), encoding="utf-8")
    with open(os.path.join(KJV, "test.txt"), encoding="utf-8") as f:
        (folder / "b.txt").write_text(f.read(3000), encoding="utf-8")
    (folder / "empty.txt").write_text("", encoding="utf-8")
    a = amptrain.evaluate(run, data=str(folder / "a.txt"))
    with pytest.raises(DataError, match="no text in the data split"):
        amptrain.evaluate(run, data=str(folder / "empty.txt"))
    b = amptrain.evaluate(run, data=str(folder / "b.txt"))  # main: A's score again, or "no text"
    assert b["tokens"] != a["tokens"] and b == amptrain.evaluate(run, data=str(folder / "b.txt"))
    assert amptrain.evaluate(run, data=str(folder / "a.txt")) == a
    (folder / "train.txt").write_text(good[:3000], encoding="utf-8")  # the run's vocabulary indexes the old
    with pytest.raises(DataError, match=r"vocabulary was learned from other training data .*train.txt changed"):
        amptrain.fit(str(folder / "tiny.toml"), ["train.steps=3"], run_dir=run)
