"""Translation: batches and the loss mask, detokenising, and a tiny run end to end under
mixed_bfloat16 with XLA, scored and used to translate."""

import math

import forked_cli  # tests/: `amptrain` forked after the import
import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
from conftest import assert_only_amptrains

import amptrain
from amptrain.data.batching import BatchPlan, rows_for_tokens
from amptrain.engine.run_log import read_metrics
from amptrain.models.losses import smoothed_cross_entropy
from amptrain.tasks.translation.task import TranslationTask, detokenize, pair_split


def test_padding_adds_nothing_to_the_loss_or_the_count():
    # Uniform logits: every real target costs log(vocabulary), with or without smoothing.
    labels = np.array([[3, 4, 0, 0]], np.int32)
    weights = (labels != 0).astype(np.float32)
    logits = np.zeros((1, 4, 10), np.float32)
    logits[0, 2:] = np.random.default_rng(0).normal(size=(2, 10)) * 50  # padding positions: anything
    for smoothing in (0.0, 0.1):
        total, count = smoothed_cross_entropy(tf.constant(labels), tf.constant(logits), tf.constant(weights), smoothing)
        assert float(count) == 2.0
        assert float(total) == pytest.approx(2 * math.log(10), rel=1e-6)


def test_label_smoothing_spreads_the_target_over_the_vocabulary():
    # log p = [log 0.5, log 0.25, log 0.25]; gold 0: (1 - e)(-log 0.5) + e * mean(-log p).
    logits = np.log(np.array([[[0.5, 0.25, 0.25]]], np.float32))
    total, _ = smoothed_cross_entropy(tf.constant([[0]]), tf.constant(logits), tf.constant([[1.0]]), 0.3)
    expected = 0.7 * math.log(2) + 0.3 * (math.log(2) + 2 * math.log(4)) / 3
    assert float(total) == pytest.approx(expected, rel=1e-6)


def test_a_batch_shifts_the_target_and_masks_padding():
    pairs = [None, None]
    split = pair_split(
        "t",
        "t",
        pairs,
        [np.array([5, 6, 7]), np.array([8])],
        [np.array([10, 11]), np.array([12, 13, 14])],
        max_length=8,
        start_id=2,
        end_id=3,
    )
    assert split.lengths.tolist() == [3, 4]  # the longer side: source 3; decoder 1 + 3 pieces
    features, targets, counts = TranslationTask.batch_builder(None, split)(np.array([0, 1, -1]), 8)
    assert features["source_ids"][0].tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert features["target_ids"][0].tolist() == [2, 10, 11, 0, 0, 0, 0, 0]  # start, pieces
    assert targets["labels"][0].tolist() == [10, 11, 3, 0, 0, 0, 0, 0]  # pieces, end
    assert targets["weights"][0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert targets["weights"][2].sum() == 0 and not features["source_mask"][2].any()  # a padding row
    assert counts.tolist() == [[3 + 3, 16], [1 + 4, 16], [0, 16]]  # real (source + decoder), padded


def test_a_cut_target_still_ends_with_the_end_piece():
    split = pair_split("t", "t", [None], [np.arange(10, 30)], [np.arange(40, 60)], max_length=6, start_id=2, end_id=3)
    assert split.encoded["target_ids"][0].tolist() == [2, 40, 41, 42, 43, 3]
    assert split.encoded["source_ids"][0].tolist() == [10, 11, 12, 13, 14, 15]
    assert split.truncated == 1


def test_token_budget_rows_and_the_plan_that_uses_them():
    assert rows_for_tokens([16, 24, 64], 2048) == [128, 80, 32]  # 2048/24 = 85 -> 80, a multiple of 8
    assert rows_for_tokens([64, 512], 300) == [4, 1]  # under 8 rows fit: as many as fit, at least one
    lengths = [10] * 300 + [60] * 40
    plan = BatchPlan(lengths, rows_for_tokens([16, 64], 2048), [16, 64], seed=0)
    assert plan.steps_per_epoch == 3 + 2  # 300 in batches of 128, 40 in batches of 32
    shapes = sorted({(len(indices), length) for indices, length in plan.epoch(0)})
    assert shapes == [(32, 64), (128, 16)]
    seen = np.concatenate([indices for indices, _ in plan.epoch(0)])
    assert sorted(seen[seen >= 0].tolist()) == list(range(340))


@pytest.mark.parametrize(
    "pieces, text",
    [
        (
            ["Y", "dijo", "Dios", ":", "Sea", "la", "luz", ";", "y", "fue", "la", "luz", "."],
            "Y dijo Dios: Sea la luz; y fue la luz.",
        ),
        (["¿", "Qui", "##én", "eres", "tú", "?"], "¿Quién eres tú?"),
        (["the", "LORD", "'", "s", "house", ",", "(", "selah", ")"], "the LORD's house, (selah)"),
        ([], ""),
    ],
)
def test_detokenize_joins_pieces_and_punctuation(pieces, text):
    assert detokenize(pieces) == text


@pytest.fixture(scope="module")
def run(tiny_translation):
    overrides = ["precision.policy=mixed_bfloat16", "runtime.jit_compile=true", "runtime.steps_per_execution=2"]
    amptrain.fit(str(tiny_translation / "tiny.toml"), overrides, run_dir=str(tiny_translation / "bf16"))
    return tiny_translation / "bf16"


@pytest.mark.slow  # trains past a few steps: out of the 5-minute quick tier
def test_the_final_test_record_agrees_with_the_predictions_file(run, tiny_translation):
    records = read_metrics(run / "metrics.jsonl")
    assert records[0]["policy"] == "mixed_bfloat16" and records[0]["jit_compile"] is True
    assert_only_amptrains(run)
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8]
    dev = [r for r in records if r["kind"] == "eval" and r["split"] == "dev"]
    assert [r["step"] for r in dev] == [4, 8] and all(r["sentences"] == 8 and r["beam_size"] == 1 for r in dev)
    test = [r for r in records if r["kind"] == "eval" and r["split"] == "test"][-1]
    best = max(dev, key=lambda r: r["bleu"])
    assert test["checkpoint"] == f"ckpt-{best['step']}"
    assert test["sentences"] == 12 and test["beam_size"] == 3
    for key in ("bleu", "chrf", "bleu_greedy", "chrf_greedy"):
        assert 0.0 <= test[key] <= 100.0
    rows = [line.split("\t") for line in (run / "predictions-test.tsv").read_text(encoding="utf-8").split("\n")[:-1]]
    pairs = [line.split("\t") for line in (tiny_translation / "test.tsv").read_text(encoding="utf-8").split("\n")[:-1]]
    assert [row[:2] for row in rows] == pairs  # every test pair, in order
    hypotheses, references = [row[2] for row in rows], [row[1] for row in rows]
    assert sacrebleu.corpus_bleu(hypotheses, [references]).score == pytest.approx(test["bleu"])
    assert sacrebleu.corpus_chrf(hypotheses, [references]).score == pytest.approx(test["chrf"])


@pytest.mark.slow
def test_eval_and_predict_translate_like_the_run(run, tiny_translation):
    test = [r for r in read_metrics(run / "metrics.jsonl") if r.get("split") == "test"][-1]
    scores = amptrain.evaluate(str(run), split="test")
    assert scores["bleu"] == pytest.approx(test["bleu"]) and scores["chrf_greedy"] == pytest.approx(test["chrf_greedy"])
    rows = (run / "predictions-test.tsv").read_text(encoding="utf-8").split("\n")
    source, _, hypothesis = rows[0].split("\t")
    records = amptrain.predict(str(run), [source, ""])
    assert records == [{"text": source, "translation": hypothesis}, {"text": "", "translation": ""}]


@pytest.mark.slow
def test_predict_translates_a_file_line_by_line(run, tmp_path):
    rows = (run / "predictions-test.tsv").read_text(encoding="utf-8").split("\n")
    sources, hypotheses = zip(*[(r.split("\t")[0], r.split("\t")[2]) for r in rows[:2]])
    path = tmp_path / "in.txt"
    path.write_text(f"{sources[0]}\n\n{sources[1]}\n", encoding="utf-8")
    result = forked_cli.run(["predict", str(run), "--input", str(path)])
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert out.split("\n") == [hypotheses[0], "", hypotheses[1], ""]


def test_separate_vocabularies_are_learned_a_side_and_saved(tiny_translation, tmp_path):
    from amptrain.config import load_config

    config = load_config(tiny_translation / "tiny.toml", ["data.shared_vocabulary=false", "model.tie_embeddings=true"])
    task = TranslationTask(config, str(tmp_path))
    task.prepare(("train",))
    assert (tmp_path / "vocab-source.txt").exists() and (tmp_path / "vocab-target.txt").exists()
    assert not (tmp_path / "vocab.txt").exists()
    assert task.source_tokenizer is not task.target_tokenizer
    # Each side's own pieces: Spanish accents on the target side only.
    assert "á" in task.target_tokenizer.vocabulary and "á" not in task.source_tokenizer.vocabulary
    model = task.build_model("float32")
    assert model.source_embedding is not model.target_embedding
    assert model.output_projection.tied_embedding is model.target_embedding  # tied to the target side
    # A second task on the same run folder reads the saved files instead of learning anew.
    again = TranslationTask(config, str(tmp_path))
    again.prepare(("dev",))
    assert again.target_tokenizer.vocabulary == task.target_tokenizer.vocabulary
