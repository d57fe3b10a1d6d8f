"""Entity spans from BIO tags, and their entity-level scores, with conlleval's semantics.

    spans(["B-person", "I-person", "O", "I-location"])
    # [("person", 0, 2), ("location", 3, 4)]   (type, first word, one past the last word)
    score([["B-person", "I-person"]], [["B-person", "O"]])
    # {"entity_f1": 0.0, "precision": 0.0, "recall": 0.0, "token_accuracy": 0.5, ...}

The conlleval rule (CoNLL-2000's scorer, which `seqeval` follows in its default mode): an
entity starts at `B-T`, or at `I-T` when the tag before it is not `B-T` or `I-T` (an `I-`
that follows `O` or another type starts an entity of its own; it is not dropped). It goes on
through the `I-T` tags that follow. An entity counts as found only when a predicted entity
has exactly its first word, its last word and its type: a partial span or a wrong type is
both a false positive and a false negative.
"""

OUTSIDE = "O"


def spans(tags):
    """The entities of one sentence's tags: a list of (type, start, end), end exclusive."""
    found = []
    kind, start = None, 0
    for position, tag in enumerate(tags):
        prefix, tag_type = (tag[0], tag[2:]) if tag != OUTSIDE else (OUTSIDE, None)
        continues = prefix == "I" and tag_type == kind
        if kind is not None and not continues:
            found.append((kind, start, position))
            kind = None
        if prefix in ("B", "I") and not continues:
            kind, start = tag_type, position
    if kind is not None:
        found.append((kind, start, len(tags)))
    return found


def score(gold_sentences, predicted_sentences):
    """Entity precision, recall and F1 (micro, and per type), and token accuracy.

    Each argument is a list of sentences, each a list of tags; sentences are scored
    apart, so an entity never runs across a sentence boundary."""
    gold_all, predicted_all = set(), set()
    correct_tokens = total_tokens = 0
    for index, (gold, predicted) in enumerate(zip(gold_sentences, predicted_sentences, strict=True)):
        if len(gold) != len(predicted):
            raise ValueError(f"sentence {index}: {len(gold)} gold tags but {len(predicted)} predicted")
        gold_all.update((index, *span) for span in spans(gold))
        predicted_all.update((index, *span) for span in spans(predicted))
        correct_tokens += sum(g == p for g, p in zip(gold, predicted))
        total_tokens += len(gold)
    types = sorted({span[1] for span in gold_all | predicted_all})
    per_type = {t: _counts({s for s in gold_all if s[1] == t}, {s for s in predicted_all if s[1] == t}) for t in types}
    micro = _counts(gold_all, predicted_all)
    return {
        "entity_f1": micro["f1"],
        "precision": micro["precision"],
        "recall": micro["recall"],
        "token_accuracy": correct_tokens / total_tokens if total_tokens else 0.0,
        "gold_entities": micro["gold"],
        "predicted_entities": micro["predicted"],
        "correct_entities": micro["correct"],
        "per_type": per_type,
    }


def _counts(gold, predicted):
    correct = len(gold & predicted)
    precision = correct / len(predicted) if predicted else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "gold": len(gold),
        "predicted": len(predicted),
        "correct": correct,
    }
