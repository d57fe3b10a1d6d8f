"""The export's in-graph text operations against the Python they stand for: Python's
character classes in RE2, the word split of `predict`, the tagger's word features and
the translator's detokenizing (quick: no model is trained)."""

import random
import re

import numpy as np
import pytest
import tensorflow as tf

from amptrain.data.vocabulary import RESERVED_TOKENS, SEP
from amptrain.serving import unicode_classes
from amptrain.tasks.ner import conll
from amptrain.tasks.ner.features import WORD
from amptrain.tasks.ner.serving import TaggerModule, split_words
from amptrain.tasks.translation import detokenize
from amptrain.tasks.translation.serving import detokenize_ids, join_tables

# Characters where Python's and ICU's or RE2's ideas differ, or that are spaces to one only.
TRICKY = "İıǅǈßẞﬁΣσς\u00a0\u2028\u3000\u0085\u000b\u001c’'-.@#_😀１٣ʰⅧ½é\u0301ÉŉİSTRASSE"


def random_texts(count, seed=0):
    """Texts of words, spaces and characters from all over the first planes."""
    rng = random.Random(seed)
    pool = [chr(c) for c in range(0x21, 0x3100) if c not in unicode_classes.SURROGATES] + list(TRICKY)
    words = ["New", "York", "don't", "e-mail", "U.S.", "3.14", "@john_doe", "#Obama", "https://t.co/x!", "MÜNCHEN"]
    texts = []
    for _ in range(count):
        parts = [rng.choice(words) if rng.random() < 0.3 else "".join(rng.choices(pool, k=rng.randint(1, 8)))]
        parts += [
            rng.choice([" ", "  ", "\t", "\u00a0", ""]) + rng.choice(words + pool) for _ in range(rng.randint(0, 12))
        ]
        texts.append("".join(parts))
    return texts + ["", "   ", "x" * 40 + " " + "Supercalifragilisticexpialidocious"]


@pytest.mark.parametrize("python_class", [r"\w", r"\s"])
def test_python_character_classes_match_every_code_point_in_re2(python_class):
    code_points = [cp for cp in range(unicode_classes.LAST_CODE_POINT + 1) if cp not in unicode_classes.SURROGATES]
    characters = [chr(cp) for cp in code_points]
    expected = np.array([re.fullmatch(python_class, c) is not None for c in characters])
    pattern = unicode_classes.character_class(python_class)
    matched = tf.strings.regex_full_match(tf.constant(characters), pattern).numpy()
    assert (matched == expected).all(), [hex(cp) for cp, a, b in zip(code_points, matched, expected) if a != b][:10]


def test_the_words_and_offsets_are_those_of_predicts_regex():
    texts = random_texts(400)
    words, starts, ends = split_words(tf.constant(texts))
    for i, text in enumerate(texts):
        matches = list(WORD.finditer(text))
        assert [w.decode() for w in words[i].numpy()] == [m.group() for m in matches], text
        assert starts[i].numpy().tolist() == [m.start() for m in matches]
        assert ends[i].numpy().tolist() == [m.end() for m in matches]


@pytest.fixture(scope="module")
def ner_task(tiny_ner):
    from amptrain.config import load_config
    from amptrain.tasks import prepared_in_scratch

    return prepared_in_scratch(load_config(str(tiny_ner / "tiny.toml")))


@pytest.mark.slow  # about 10 s: Python's tables over every code point, a task's vocabulary
def test_the_taggers_features_are_predicts(ner_task):
    """Pieces, word shapes with case buckets, and word characters of each text, as
    `NerTask` encodes them for `predict`, truncation included."""
    texts = random_texts(200, seed=1) + [" ".join(["word"] * 70), "Apple apple APPLE Apple"]
    ner_task.lowercase_counts = {**ner_task.lowercase_counts, "apple": 3}  # every case bucket
    module = TaggerModule(ner_task, ner_task.build_model("float32"))
    features, kept, _ = module.features(split_words(tf.constant(texts))[0])
    sentences = [tuple(m.group() for m in WORD.finditer(text)) for text in texts]
    present = [i for i, words in enumerate(sentences) if words]
    split = ner_task._encode(
        "input",
        "input",
        [conll.Sentence(sentences[i], ("O",) * len(sentences[i]), 1) for i in present],
        [[]] * len(present),
    )
    for row, i in enumerate(present):
        ids = split.encoded["token_ids"][row]
        n = len(ids)
        assert features["token_ids"][i].numpy()[:n].tolist() == ids.tolist(), texts[i]
        assert not features["token_ids"][i].numpy()[n:].any()
        assert features["shape_ids"][i].numpy()[:n].tolist() == split.encoded["shapes"][row].tolist(), texts[i]
        assert (features["char_ids"][i].numpy()[:n] == split.encoded["chars"][row]).all(), texts[i]
    assert int((~kept.numpy()).sum()) == split.truncated > 0  # the 70 words did not all fit


def test_detokenizing_in_the_graph_joins_pieces_as_python():
    vocabulary = (
        RESERVED_TOKENS + "the LORD ' s house , ( selah ) ¿ Qui ##én eres tú ? - well ##known « » . % a".split()
    )
    rng = np.random.default_rng(0)
    rows = rng.integers(len(RESERVED_TOKENS), len(vocabulary), (300, 14)).astype(np.int32)
    rows[rng.random(rows.shape) < 0.1] = vocabulary.index(SEP)  # the end piece, anywhere
    rows[:, 0][rng.random(300) < 0.1] = vocabulary.index("##én")  # a row starting with a suffix piece
    rows[rng.random(rows.shape) < 0.05] = 0
    got = detokenize_ids(tf.constant(rows), join_tables(vocabulary), vocabulary.index(SEP)).numpy()
    for row, text in zip(rows, got):
        pieces = detokenize.until_end(row, vocabulary.index(SEP))
        assert text.decode() == detokenize.detokenize([vocabulary[i] for i in pieces])


def test_a_cut_text_keeps_its_first_pieces_then_its_last():
    from amptrain.tasks.classification.task import cut

    ids = np.arange(12)  # 0 as [CLS], 11 as [SEP] when the text ends with one
    assert cut(ids, 8, ends_with_sep=True, keep_tail=2).tolist() == [0, 1, 2, 3, 4, 9, 10, 11]
    assert cut(ids, 8, ends_with_sep=True).tolist() == [0, 1, 2, 3, 4, 5, 6, 11]
    assert cut(ids, 8, ends_with_sep=False, keep_tail=3).tolist() == [0, 1, 2, 3, 4, 9, 10, 11]
    assert cut(ids, 8, ends_with_sep=False).tolist() == list(range(8))
    assert cut(ids, 12, ends_with_sep=True, keep_tail=2).tolist() == list(range(12))


@pytest.mark.parametrize("keep_tail", [0, 5])
@pytest.mark.parametrize("fixture", ["tiny", "tiny_pretrained"])
def test_the_classifiers_graph_tokens_are_the_tasks(fixture, keep_tail, request):
    """[CLS], the pieces, [SEP] for a pretrained encoder, and the cut (head, or head + tail)
    of the serving graph, against what the task trains on (most spam texts are cut at 32)."""
    from amptrain.config import load_config
    from amptrain.tasks import prepared_in_scratch
    from amptrain.tasks.classification.serving import ClassifierModule

    path = request.getfixturevalue(fixture)
    path = path / "tiny.toml" if fixture == "tiny" else path
    task = prepared_in_scratch(load_config(str(path), [f"data.keep_tail={keep_tail}"]), ["train"])
    split = task.splits["train"]
    assert split.truncated > 0
    module = ClassifierModule(task, task.build_model("float32"))
    graph = module.token_ids(tf.constant([e.text for e in split.examples])).numpy()
    for row, ids in enumerate(split.encoded["token_ids"]):
        assert graph[row, : len(ids)].tolist() == ids.tolist(), split.examples[row].text
        assert not graph[row, len(ids) :].any()
