"""The user's task of examples/parallel_sentences, named by import path: its cut and its
negatives by hand, its serving graph against its Python encoding, and (slow) the shipped
config through the CLI: fit, `eval` from another directory, export equal to `predict`."""

import json
import os
import sys

import forked_cli  # tests/: `amptrain` forked after the import
import numpy as np
import pytest
from conftest import ROOT

from amptrain import config as config_lib
from amptrain.data.parallel import Pair

EXAMPLE = os.path.join(ROOT, "examples", "parallel_sentences")
CONFIG = os.path.join(EXAMPLE, "parallel-sentences.toml")
TINY = [
    "train.steps=4",
    "train.log_every=2",
    "train.checkpoint_every=2",
    "train.eval_every=2",
    "train.batch_size=16",
    "data.vocabulary_size=300",
    "data.max_length=32",
    "model.num_layers=1",
    "model.hidden_dim=16",
    "model.num_heads=2",
    "model.intermediate_dim=32",
    "precision.policy=float32",
    "runtime.jit_compile=false",
    "runtime.steps_per_execution=1",
]


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, EXAMPLE)
    import parallel_sentences

    return parallel_sentences


@pytest.fixture
def tiny_pairs(tmp_path):
    with open(os.path.join(ROOT, "data", "translate-en-es", "train.tsv"), encoding="utf-8") as f:
        lines = f.readlines()
    for name, part in (("train", lines[:64]), ("dev", lines[64:80]), ("test", lines[80:96])):
        (tmp_path / f"{name}.tsv").write_text("".join(part), encoding="utf-8")
    return [*TINY, *(f"data.{s}={tmp_path / s}.tsv" for s in ("train", "dev", "test"))]


def test_each_side_keeps_half_the_room_or_all_of_itself(example):
    assert example.room(3, 4, 10) == (3, 4)  # both fit
    assert example.room(2, 20, 10) == (2, 8)  # the short side leaves the rest to the long one
    assert example.room(20, 3, 10) == (7, 3)
    assert example.room(20, 20, 11) == (5, 6)  # both long: half each, the odd piece to the second


def test_negatives_pair_each_english_line_with_another_lines_spanish(example):
    pairs = [Pair(f"en {i}", f"es {i}", i + 1) for i in range(5)]
    examples = example.with_negatives(pairs, seed=0, salt="train")
    assert examples[:5] == [(f"en {i}", f"es {i}", 1) for i in range(5)]
    negatives = examples[5:]
    assert [e[0] for e in negatives] == [f"en {i}" for i in range(5)]
    assert all(english[3:] != spanish[3:] and label == 0 for english, spanish, label in negatives)
    assert example.with_negatives(pairs, seed=0, salt="train") == examples  # seeded
    assert example.with_negatives(pairs, seed=1, salt="train") != examples


def test_the_config_names_the_class_and_records_its_folder(tiny_pairs):
    config = config_lib.load_config(CONFIG, tiny_pairs)
    assert config.task == "parallel_sentences:ParallelSentences"
    assert config.task_path == EXAMPLE  # saved into the run's config.toml: eval works from anywhere
    assert config_lib.to_dict(config)["task_path"] == EXAMPLE


@pytest.mark.slow  # 20 s of tokenizer and model building: out of the quick tier's budget
def test_the_serving_graph_tokenizes_as_the_task(example, tiny_pairs):
    from pair_serving import PairModule

    from amptrain.tasks import prepared_in_scratch

    task = prepared_in_scratch(config_lib.load_config(CONFIG, tiny_pairs))
    model, _, _ = task.create_model()
    split = task.splits["train"]
    texts = [f"{english}\t{spanish}" for english, spanish, _ in split.examples[:40:3]]
    ids, segments = (t.numpy() for t in PairModule(task, model).token_ids(np.array(texts, dtype=object)))
    for row, index in enumerate(range(0, 40, 3)):
        length = len(split.encoded["token_ids"][index])
        assert ids[row, :length].tolist() == split.encoded["token_ids"][index].tolist()
        assert segments[row, :length].tolist() == split.encoded["segment_ids"][index].tolist()
        assert not ids[row, length:].any()
    assert split.truncated > 0  # some of those were cut (max_length 32)


def amptrain(*args, cwd=ROOT):
    result = forked_cli.run(args, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_the_example_trains_evaluates_and_exports_from_the_cli(tiny_pairs, tmp_path):
    run = str(tmp_path / "run")
    sets = [arg for setting in tiny_pairs for arg in ("--set", setting)]
    amptrain("fit", CONFIG, "--run-dir", run, *sets)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scored = json.loads(amptrain("eval", run, cwd=elsewhere))  # the task's module found from the run folder
    assert scored["examples"] == 32 and 0 <= scored["accuracy"] <= 1
    texts = ["In the beginning God created the heaven.\tEn el principio crió Dios los cielos.", "Yes\tNo"]
    text_args = [arg for text in texts for arg in ("--text", text)]
    from_run = [json.loads(line) for line in amptrain("predict", run, *text_args, cwd=elsewhere).splitlines()]
    amptrain("export", run, cwd=elsewhere)
    exported = os.path.join(run, "export")
    from_export = [json.loads(line) for line in amptrain("predict", exported, *text_args, cwd=elsewhere).splitlines()]
    assert [r["label"] for r in from_export] == [r["label"] for r in from_run]
    for a, b in zip(from_run, from_export):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-5)
