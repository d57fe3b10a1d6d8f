"""Runs that could end wrong: a split padded past its longest text, signals
during an evaluation or the final test, and runs that train to nonsense without a word."""

import os
import signal
import types

import pytest
from conftest import write_rows

from amptrain import config as config_lib
from amptrain.cli import main
from amptrain.data.batching import round_up
from amptrain.engine.numerics import _advice
from amptrain.engine.run_log import read_metrics
from amptrain.tasks import prepared_in_scratch
from amptrain.tasks.classification.task import ClassificationTask


def in_process(capsys, *args):
    capsys.readouterr()
    status = main(list(args))
    return status, capsys.readouterr().err.strip().splitlines()


# === 3. Every split padded to its own lengths ===


def test_no_split_is_padded_past_its_longest_example_with_a_huge_max_length(tiny, spam_rows):
    longest = max(len(text) for text, _ in spam_rows[:96])
    write_rows(tiny / "test.csv", [("word " * 300, "ham")] + spam_rows[128:140])  # longer than any training text
    config = config_lib.load_config(
        tiny / "tiny.toml", [("data.max_length", 100000), ("data.test", str(tiny / "test.csv"))]
    )
    task = prepared_in_scratch(config, ("train", "dev", "test"))
    assert max(task.splits["train"].lengths) <= longest  # the training split never neared 100,000
    for name, split in task.splits.items():
        plan = task.plan(split, shuffle=False)
        padded = max(length for _, length in plan.epoch(0))
        # main: the test split took the training boundaries, ending at 100,000
        assert padded <= round_up(max(split.lengths)), (name, padded, max(split.lengths))


# === 5. Signals during an evaluation and the final test ===


def signal_during(monkeypatch, signum, split):
    """Sends `signum` to this process during the first evaluation of `split` (once its
    scores are computed, before the loop has them)."""
    real = ClassificationTask.evaluate
    sent = []

    def evaluate(self, split_name, *args, **kwargs):
        metrics = real(self, split_name, *args, **kwargs)
        if split_name == split and not sent:
            sent.append(split_name)
            os.kill(os.getpid(), signum)
        return metrics

    monkeypatch.setattr(ClassificationTask, "evaluate", evaluate)
    return sent


@pytest.mark.slow  # three short fits in this process
def test_sigterm_during_the_last_evaluation_and_the_final_test_say_so_and_resume(tiny, capsys, monkeypatch):
    fit = ["fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "run")]
    sent = signal_during(monkeypatch, signal.SIGTERM, "dev")  # the only dev evaluation: the last step's
    status, lines = in_process(capsys, *fit)
    assert sent and status == 143  # main: dropped, the run went on to the final test and exited 0
    assert lines[-1] == "amptrain: stopped by SIGTERM after saving a checkpoint; rerun to resume"
    monkeypatch.undo()
    sent = signal_during(monkeypatch, signal.SIGTERM, "test")
    status, lines = in_process(capsys, *fit)
    assert sent and status == 143  # main: 143 from the default handler, no message
    assert lines[-1] == "amptrain: stopped by SIGTERM after saving a checkpoint; rerun to resume"
    assert not any(r["kind"] == "end" for r in read_metrics(tiny / "run" / "metrics.jsonl"))
    monkeypatch.undo()
    status, _ = in_process(capsys, *fit)
    records = read_metrics(tiny / "run" / "metrics.jsonl")
    assert status == 0 and records[-1]["kind"] == "end"
    assert [r["split"] for r in records if r["kind"] == "eval"] == ["dev", "test"]


@pytest.fixture
def ctrl_c():
    """SIGINT raising KeyboardInterrupt, as in a terminal: a background job of a
    non-interactive shell (`pytest ... &` in a script) starts with SIGINT ignored, and
    Python keeps it so; the signal would then never reach the run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow  # three short fits in this process
def test_a_resume_redoes_the_evaluation_a_sigint_interrupted(tiny, capsys, monkeypatch, ctrl_c):
    overrides = ["--set", "train.eval_every=4", "--set", "model.dropout=0.0"]
    status, _ = in_process(capsys, "fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "whole"), *overrides)
    assert status == 0
    fit = ["fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "run"), *overrides]
    sent = signal_during(monkeypatch, signal.SIGINT, "dev")  # the first: step 4's
    status, _ = in_process(capsys, *fit)
    assert sent and status == 130
    monkeypatch.undo()
    assert in_process(capsys, *fit)[0] == 0

    def evaluations(name):
        return [(r["step"], r["accuracy"]) for r in read_metrics(tiny / name / "metrics.jsonl") if r["kind"] == "eval"]

    # main: step 4's evaluation never made (2 dev records against 3), so the best could differ
    assert [step for step, _ in evaluations("run")] == [4, 8, 12, evaluations("run")[-1][0]]
    assert evaluations("run") == evaluations("whole")


# === 7. Silent nonsense ===


def test_one_label_training_data_is_refused_in_one_line(tiny, spam_rows, capsys):
    write_rows(tiny / "train.csv", [row for row in spam_rows if row[1] == "ham"][:96])
    status, lines = in_process(capsys, "fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "run"))
    assert status == 2  # main: trained to "accuracy 1.0000"
    assert lines[-1] == (
        f"amptrain: error: {tiny}/train.csv: every example has the label 'ham'; "
        "a classifier needs at least two labels in its training split"
    )


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_non_finite_learning_rate_is_refused(tiny, capsys, value):
    status, lines = in_process(capsys, "fit", str(tiny / "tiny.toml"), "--set", f"train.learning_rate={value}")
    assert status == 2  # main: inf passed validation
    assert lines == [f"amptrain: error: train.learning_rate: expected a finite number > 0, received {value}"]


def test_an_absurd_learning_rate_and_a_diverging_float32_loss_are_named(tiny, capsys):
    overrides = ["--set", "train.learning_rate=1000", "--set", "precision.policy=float32"]
    status, lines = in_process(capsys, "fit", str(tiny / "tiny.toml"), "--run-dir", str(tiny / "run"), *overrides)
    # main: no word, whether the run ends at a non-finite step or exits 0 with the loss at 1e9
    assert any(line.startswith("train.learning_rate = 1000 is far above what Adam trains") for line in lines)
    assert any("times its first value" in line and "training is diverging under float32" in line for line in lines)


def advice(tiny, policy, learning_rate):
    config = config_lib.load_config(
        tiny / "tiny.toml", [("precision.policy", policy), ("train.learning_rate", learning_rate)]
    )
    return "\n".join(_advice(config, types.SimpleNamespace(loss_scale=None), ["block_0/ffn_out", "logits"]))


def test_the_numerics_advice_fits_the_policy_and_names_an_absurd_learning_rate_first(tiny):
    float32 = advice(tiny, "float32", 1000.0)
    # main: bf16 and "pin the layer ... to float32" for a run already in float32, the learning rate last
    assert "mixed_bfloat16" not in float32 and "pin the layer" not in float32
    assert float32.splitlines()[0].startswith("  - a lower train.learning_rate (now 1000: far above")
    float16 = advice(tiny, "mixed_float16", 1e-3)
    assert "mixed_bfloat16" in float16 and "pin the layer where it began (logits)" in float16
    assert "mixed_bfloat16" not in advice(tiny, "mixed_bfloat16", 1e-3)
