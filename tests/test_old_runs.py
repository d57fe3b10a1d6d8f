"""Run folders saved by an older amptrain still load and predict as they did
(tests/old_runs/README.md says how they were made)."""

import json
import pathlib
import shutil

import pytest

from amptrain import api

OLD_RUNS = pathlib.Path(__file__).resolve().parent / "old_runs"
EXPECTED = json.loads((OLD_RUNS / "expected.json").read_text(encoding="utf-8"))


def close(found, expected):
    """Equal, but probabilities within 1e-4: another CPU may round the last bits otherwise."""
    if isinstance(expected, float):
        return found == pytest.approx(expected, abs=1e-4)
    if isinstance(expected, dict):
        return found.keys() == expected.keys() and all(close(found[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        return len(found) == len(expected) and all(close(f, e) for f, e in zip(found, expected))
    return found == expected


@pytest.mark.parametrize("task", ["classification", "ner", "translation"])
def test_a_run_folder_of_an_older_amptrain_predicts_as_it_did(task, tmp_path):
    run = shutil.copytree(OLD_RUNS / task, tmp_path / task)  # predicting may write beside the run
    found = api.predict(str(run), EXPECTED["texts"][task])
    assert close(found, EXPECTED["predictions"][task]), (found, EXPECTED["predictions"][task])


@pytest.mark.parametrize("task", ["classification", "ner", "translation"])
def test_a_nul_character_is_read_as_a_space_not_as_the_end_of_the_text(task, tmp_path):
    """TensorFlow's UTF-8 string ops end a text at a NUL: "a\\0<a spam mail>" scored as "a"."""
    run = shutil.copytree(OLD_RUNS / task, tmp_path / task)
    text = EXPECTED["texts"][task][0]
    with_nul, with_space, cut = api.predict(str(run), ["a\0" + text, "a " + text, "a"])
    assert {**with_nul, "text": None} == {**with_space, "text": None} != {**cut, "text": None}
    assert with_nul["text"] == "a\0" + text
