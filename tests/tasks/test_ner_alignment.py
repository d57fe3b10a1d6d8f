"""Sub-word alignment: a word's tag on its first piece, its other pieces masked out,
truncation at word boundaries and counted, words without pieces kept."""

import numpy as np
import pytest

from amptrain import config as config_lib
from amptrain.data.vocabulary import RESERVED_TOKENS, pad_to_multiple, save_vocabulary
from amptrain.tasks.ner.features import align
from amptrain.tasks.ner.task import NerTask

PIECES = ["Em", "##pire", "State", "ES", "##B", "=", "@", "bob", "storm"]
SENTENCES = "Empire\tB-location\nState\tI-location\n=\tO\nESB\tB-location\n\n@bob\tB-person\n\u200b\tO\nstorm\tO\n"


def test_align_keeps_whole_words_and_counts_the_cut_ones():
    words = [[5, 6], [7], [8, 9, 10]]
    ids, firsts, truncated = align(words, max_length=7, cls_id=2)
    assert ids.tolist() == [2, 5, 6, 7, 8, 9, 10] and firsts.tolist() == [1, 3, 4] and truncated == 0
    # 4 pieces in, the third word's 3 do not fit into 5: it is cut whole, never split
    ids, firsts, truncated = align(words, max_length=5, cls_id=2)
    assert ids.tolist() == [2, 5, 6, 7] and firsts.tolist() == [1, 3] and truncated == 1
    # a first word too long for max_length truncates the whole sentence
    ids, firsts, truncated = align(words, max_length=2, cls_id=2)
    assert ids.tolist() == [2] and firsts.tolist() == [] and truncated == 3


def make_task(tmp_path, *overrides):
    (tmp_path / "train.conll").write_text(SENTENCES, encoding="utf-8")
    vocabulary = pad_to_multiple(RESERVED_TOKENS + PIECES, 8)
    save_vocabulary(vocabulary, tmp_path / "hand-vocab.txt")
    raw = {
        "task": "ner",
        "data": {"train": str(tmp_path / "train.conll"), "vocabulary": str(tmp_path / "hand-vocab.txt")},
    }
    config = config_lib.config_from_dict(raw, overrides)
    (tmp_path / "run").mkdir()
    task = NerTask(config, str(tmp_path / "run"))
    task.prepare(("train",))
    return task, vocabulary


def test_multi_piece_words_carry_their_tag_on_the_first_piece_only(tmp_path):
    task, vocabulary = make_task(tmp_path)
    split = task.splits["train"]
    pieces = [[vocabulary[i] for i in ids] for ids in split.encoded["token_ids"]]
    # "@bob" is two pieces (punctuation splits); the zero-width space makes none: one [UNK]
    assert pieces == [["[CLS]", "Em", "##pire", "State", "=", "ES", "##B"], ["[CLS]", "@", "bob", "[UNK]", "storm"]]
    assert [f.tolist() for f in split.encoded["first_pieces"]] == [[1, 3, 4, 5], [1, 3, 4]]
    features, targets, token_counts = task.batch_builder(split)(np.array([0, 1, -1]), 8)
    # the model's target is a word's entity type (runs of one type are one entity)
    classes = [[task.classes[i] for i in row] for row in targets["labels"]]
    assert classes[0][:7] == ["O", "location", "O", "location", "O", "location", "O"]
    assert classes[1][:5] == ["O", "person", "O", "O", "O"]
    assert targets["weights"].tolist() == [
        [0, 1, 0, 1, 1, 1, 0, 0],  # [CLS], ##pire, ##B and padding are out of the loss and metrics
        [0, 1, 0, 1, 1, 0, 0, 0],
        [0] * 8,  # a padding row
    ]
    assert features["padding_mask"].sum(axis=1).tolist() == [7, 5, 0]
    assert token_counts.tolist() == [[7, 8], [5, 8], [0, 8]]


def echo_gold(num_classes):
    """A predict function whose logits pick each first piece's gold tag."""

    def predict(dataset):
        return [np.eye(num_classes, dtype=np.float32)[targets["labels"].numpy()] * 10 for _, targets, _ in dataset]

    return predict


def test_truncated_words_are_counted_predicted_o_and_missed(tmp_path):
    # [CLS] Em ##pire State = is 5 pieces: ESB (2 more) does not fit into 6
    task, _ = make_task(tmp_path, "data.max_length=6")
    split = task.splits["train"]
    assert split.truncated == 1
    metrics = task.evaluate("train", None, echo_gold(len(task.classes)), str(tmp_path / "predictions"))
    assert metrics["truncated_words"] == 1 and metrics["words"] == 7
    assert (metrics["gold_entities"], metrics["correct_entities"], metrics["predicted_entities"]) == (3, 2, 2)
    assert metrics["recall"] == pytest.approx(2 / 3) and metrics["precision"] == 1.0
    lines = (tmp_path / "predictions.conll").read_text(encoding="utf-8").split("\n")
    assert lines[:5] == [
        "Empire\tB-location\tB-location",
        "State\tI-location\tI-location",
        "=\tO\tO",
        "ESB\tB-location\tO",
        "",
    ]
    assert lines[5:9] == ["@bob\tB-person\tB-person", "\u200b\tO\tO", "storm\tO\tO", ""]


def test_ner_keeps_case_by_default_and_classification_lowercases(tmp_path):
    task, _ = make_task(tmp_path)
    assert task.lowercase is False
    assert NerTask(
        config_lib.config_from_dict(
            {"task": "ner", "data": {"lowercase": True, "train": str(tmp_path / "train.conll")}}
        ),
        "",
    ).lowercase
    from amptrain.tasks.classification.task import ClassificationTask

    classification = config_lib.config_from_dict({"data": {"train": str(tmp_path / "train.conll"), "format": "csv"}})
    assert ClassificationTask(classification, "").lowercase is True
    # None ("the task's default") is left out of the saved TOML and comes back as None
    config_lib.save_config(task.config, tmp_path / "saved.toml")
    assert "lowercase" not in (tmp_path / "saved.toml").read_text()
    assert config_lib.load_config(tmp_path / "saved.toml") == task.config


def test_the_format_must_suit_the_task(tmp_path):
    (tmp_path / "train.conll").write_text(SENTENCES, encoding="utf-8")
    with pytest.raises(
        config_lib.ConfigError,
        match=r"data\.format: expected one of \('auto', 'conll'\) for task 'ner', received 'csv'",
    ):
        config_lib.config_from_dict({"task": "ner", "data": {"train": str(tmp_path / "train.conll"), "format": "csv"}})


def test_outside_weight_scales_o_words_and_the_loss_counts_real_words(tmp_path):
    import tensorflow as tf

    task, _ = make_task(tmp_path, "train.outside_weight=0.25")
    features, targets, _ = task.batch_builder(task.splits["train"])(np.array([0, -1]), 8)
    assert targets["weights"][0].tolist() == [0, 1, 0, 1, 0.25, 1, 0, 0]  # "=" is O
    logits = tf.zeros(targets["labels"].shape + (len(task.classes),))
    loss_sum, count = task.loss({k: tf.constant(v) for k, v in targets.items()}, logits)
    # uniform logits: every word's cross-entropy is log(3): O, location, person; 3 entity words, one O at 0.25
    assert float(count) == 4.0
    assert float(loss_sum) == pytest.approx(3.25 * np.log(3), rel=1e-5)


def test_word_shapes_by_hand():
    from amptrain.tasks.ner.features import SHAPES, piece_shapes, word_shape

    def name(word, start=False):
        shape = word_shape(word, start)
        return SHAPES[(shape - 1) % len(SHAPES)], shape > len(SHAPES)

    assert [
        name(w)[0]
        for w in ["storm", "Empire", "ESB", "iPhone", "I", "2017", "=", "@paulwalk", "#tbt", "https://t.co/x", "2pm"]
    ] == ["lower", "title", "caps", "mixed", "title", "number", "punctuation", "mention", "hashtag", "url", "lower"]
    assert name("It", start=True) == ("title", True)
    # [CLS] gets 0; every piece of a word gets the word's shape; the first word is marked as the start.
    shapes = piece_shapes(["Empire", "State", "x"], ids=[2, 10, 11, 12, 13], firsts=[1, 3, 4])
    assert list(shapes) == [
        0,
        word_shape("Empire", True),
        word_shape("Empire", True),
        word_shape("State", False),
        word_shape("x", False),
    ]


def test_word_characters_by_hand():
    from amptrain.tasks.ner.features import CHARS_PER_WORD, NUM_CHARS, char_id, piece_chars, word_chars

    # printable ASCII is ord - 30; 1 and 2 mark the word's start and end; 0 pads
    assert word_chars("Bob").tolist() == [1, 36, 81, 68, 2] + [0] * 15
    assert word_chars("@x1", size=8).tolist() == [1, 34, 90, 19, 2, 0, 0, 0]
    # é is e; other letters and digits by class; an emoji is "anything else"
    assert [char_id(c) for c in "éÉλΛ中٣😀"] == [71, 39, 98, 97, 99, 100, 101]
    assert max(char_id(chr(c)) for c in range(0x2FFFF)) < NUM_CHARS and NUM_CHARS % 8 == 0
    # a long word keeps its first and last 9 characters
    long = word_chars("abcdefghij_KLMNOPQRS")
    assert len(long) == CHARS_PER_WORD and long.tolist() == [1, *(ord(c) - 30 for c in "abcdefghiKLMNOPQRS"), 2]
    # every piece carries its word's characters; [CLS] none
    chars = piece_chars(["Em", "x"], ids=[2, 10, 11, 12], firsts=[1, 3])
    assert chars.shape == (4, CHARS_PER_WORD)
    assert chars[0].tolist() == [0] * 20 and chars[1].tolist() == chars[2].tolist() == word_chars("Em").tolist()
    assert chars[3].tolist() == word_chars("x").tolist()


def test_batches_carry_each_piece_characters(tmp_path):
    from amptrain.tasks.ner.features import word_chars

    task, _ = make_task(tmp_path)
    features, _, _ = task.batch_builder(task.splits["train"])(np.array([1, -1]), 8)
    assert features["char_ids"].shape == (2, 8, 20)
    # [CLS] @ bob [UNK] storm: "@bob" on its two pieces, then the zero-width space, then "storm"
    rows = features["char_ids"][0].tolist()
    assert rows[1] == rows[2] == word_chars("@bob").tolist() and rows[3] == word_chars("\u200b").tolist()
    assert rows[4] == word_chars("storm").tolist() and rows[0] == rows[5] == [0] * 20
    assert not features["char_ids"][1].any()


def test_capitalised_words_carry_how_often_training_saw_them_lower_case(tmp_path):
    import json

    from amptrain.tasks.ner.features import NUM_SHAPES, SHAPES, case_bucket, piece_shapes, word_shape
    from amptrain.tasks.ner.task import LOWERCASE_WORDS_FILE

    counts = {"the": 7, "storm": 1}
    # never seen lower-case: 0; 1 to 4 times: 1; 5 or more: 2; a word without capitals: 0
    assert [case_bucket(w, counts) for w in ["Empire", "Storm", "The", "THE", "storm", "2017"]] == [0, 1, 2, 2, 0, 0]
    assert case_bucket("The", None) == 0
    # the bucket moves the shape id by 18 (2 * 9 shapes) a step; the table holds the largest id
    shapes = piece_shapes(["The", "Storm", "Empire"], ids=[2, 10, 11, 12], firsts=[1, 2, 3], lowercase_counts=counts)
    assert list(shapes) == [
        0,
        word_shape("The", True) + 36,
        word_shape("Storm", False) + 18,
        word_shape("Empire", False),
    ]
    assert 1 + 2 * len(SHAPES) * 3 <= NUM_SHAPES and NUM_SHAPES % 8 == 0
    # learned from the training split's lower-case words (with a letter), saved in the run folder
    task, _ = make_task(tmp_path)
    assert task.lowercase_counts == {"@bob": 1, "storm": 1}
    assert json.loads((tmp_path / "run" / LOWERCASE_WORDS_FILE).read_text(encoding="utf-8")) == {"@bob": 1, "storm": 1}
