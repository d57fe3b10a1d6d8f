"""Entity spans and scores against hand-computed examples and, where installed, seqeval."""

import random

import pytest

from amptrain.tasks.ner.spans import score, spans


def test_spans_of_bio_and_iob2():
    tags = ["B-person", "I-person", "O", "B-location", "B-location", "I-location", "O"]
    assert spans(tags) == [("person", 0, 2), ("location", 3, 4), ("location", 4, 6)]
    assert spans(["O", "O"]) == []
    assert spans(["B-group"]) == [("group", 0, 1)]  # an entity that ends the sentence


def test_i_without_b_starts_an_entity_the_conlleval_rule():
    # after O, at the start, and after an entity of another type
    assert spans(["O", "I-person", "I-person"]) == [("person", 1, 3)]
    assert spans(["I-location", "O"]) == [("location", 0, 1)]
    assert spans(["B-person", "I-location", "I-location"]) == [("person", 0, 1), ("location", 1, 3)]


def test_a_wrong_type_and_a_partial_span_are_each_a_false_positive_and_a_false_negative():
    gold = [["B-person", "I-person", "O", "B-location", "O", "B-group"]]
    predicted = [["B-person", "O", "O", "B-group", "O", "B-group"]]
    # gold: person 0-2, location 3-4, group 5-6; predicted: person 0-1 (partial),
    # group 3-4 (wrong type), group 5-6 (right): 1 correct of 3 predicted, of 3 gold.
    metrics = score(gold, predicted)
    assert metrics["precision"] == pytest.approx(1 / 3)
    assert metrics["recall"] == pytest.approx(1 / 3)
    assert metrics["entity_f1"] == pytest.approx(1 / 3)
    assert metrics["token_accuracy"] == pytest.approx(4 / 6)
    assert (metrics["gold_entities"], metrics["predicted_entities"], metrics["correct_entities"]) == (3, 3, 1)
    per_type = metrics["per_type"]
    assert per_type["person"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 1, "predicted": 1, "correct": 0}
    assert per_type["location"]["predicted"] == 0 and per_type["location"]["recall"] == 0.0
    assert per_type["group"]["precision"] == pytest.approx(0.5)
    assert per_type["group"]["recall"] == 1.0
    assert per_type["group"]["f1"] == pytest.approx(2 / 3)


def test_i_without_b_scores_as_the_entity_it_starts():
    gold = [["O", "B-person", "I-person", "O"]]
    assert score(gold, [["O", "I-person", "I-person", "O"]])["entity_f1"] == 1.0
    # I-person after B-location: location 1-2 and person 2-3, neither is the gold person 1-3
    metrics = score(gold, [["O", "B-location", "I-person", "O"]])
    assert (metrics["predicted_entities"], metrics["correct_entities"]) == (2, 0)


def test_entities_never_cross_sentences_and_lengths_must_match():
    # one entity at the end of the first sentence, another at the start of the second
    metrics = score([["O", "B-person"], ["I-person", "O"]], [["O", "B-person"], ["I-person", "O"]])
    assert metrics["gold_entities"] == 2 and metrics["entity_f1"] == 1.0
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        score([["O", "O"]], [["O"]])


def test_nothing_predicted_scores_zero_not_nan():
    metrics = score([["B-person"]], [["O"]])
    assert (metrics["precision"], metrics["recall"], metrics["entity_f1"]) == (0.0, 0.0, 0.0)


def random_tags(rng, length):
    choices = ["O"] * 6 + [f"{p}-{t}" for p in "BI" for t in ("person", "location", "group")]
    return [rng.choice(choices) for _ in range(length)]


def test_agrees_with_seqeval_in_its_default_conlleval_mode():
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 8))]
        gold = [random_tags(rng, n) for n in lengths]
        predicted = [random_tags(rng, n) for n in lengths]
        metrics = score(gold, predicted)
        assert metrics["precision"] == pytest.approx(seqeval.precision_score(gold, predicted, zero_division=0))
        assert metrics["recall"] == pytest.approx(seqeval.recall_score(gold, predicted, zero_division=0))
        assert metrics["entity_f1"] == pytest.approx(seqeval.f1_score(gold, predicted, zero_division=0))
        report = seqeval.classification_report(gold, predicted, output_dict=True, zero_division=0)
        for kind, counts in metrics["per_type"].items():
            assert counts["f1"] == pytest.approx(report[kind]["f1-score"])
            assert counts["gold"] == report[kind]["support"]
