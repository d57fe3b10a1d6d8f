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
