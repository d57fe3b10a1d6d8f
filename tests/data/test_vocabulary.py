import collections
import os
import shutil
import subprocess
import sys

import pytest

import amptrain
from amptrain.data.vocabulary import (
    RESERVED_TOKENS,
    WordPiece,
    learn_pieces,
    pad_to_multiple,
    train_vocabulary,
    word_counts,
)
from amptrain.models.families.tokenizers import BytePairPieces


def test_pad_to_multiple_of_8():
    assert len(pad_to_multiple(["a"] * 13, 8)) == 16
    assert pad_to_multiple(["a"] * 13, 8)[13:] == ["[unused0]", "[unused1]", "[unused2]"]
    assert len(pad_to_multiple(["a"] * 16, 8)) == 16


def test_trained_vocabulary_is_sorted_after_the_reserved_tokens_and_tokenizes():
    texts = ["the cat sat on the mat", "the dog sat on the log", "cats and dogs"] * 5
    vocabulary = train_vocabulary(texts, size=60)
    assert vocabulary[:5] == RESERVED_TOKENS
    learned = [t for t in vocabulary[5:] if not t.startswith("[unused")]
    assert learned == sorted(learned)
    assert len(vocabulary) % 8 == 0
    tokenizer = WordPiece(vocabulary)
    ids = tokenizer.encode(["The cat sat", "zzz"])
    assert [vocabulary[i] for i in ids[0]] == ["the", "cat", "sat"]  # lowercased
    assert all(vocabulary[i] == "[UNK]" or vocabulary[i].strip("#") for i in ids[1])


def test_a_shared_tokenizer_is_the_one_built_for_the_same_vocabulary_casing_or_files(tmp_path):
    """`shared` hands back the tokenizer this process built for an equal vocabulary and
    casing (WordPiece) or files of the same bytes (BPE), and a new one for anything else; a
    shared one tokenizes as a new one does."""
    vocabulary = train_vocabulary(["the cat sat on the mat", "the dog sat on the log"] * 3, size=40)
    first = WordPiece.shared(vocabulary)
    assert WordPiece.shared(list(vocabulary)) is first and WordPiece.shared(vocabulary, lowercase=False) is not first
    assert WordPiece.shared(vocabulary[:-1] + ["zzz"]) is not first
    texts = ["The CAT sat", "a dog on a log"]
    assert [list(ids) for ids in first.encode(texts)] == [list(ids) for ids in WordPiece(vocabulary).encode(texts)]

    tiny_roberta = os.path.join(os.path.dirname(__file__), "..", "pretrained", "tiny-roberta")
    folder = shutil.copytree(tiny_roberta, tmp_path / "r")
    files = (str(folder / "vocab.json"), str(folder / "merges.txt"))
    pieces = BytePairPieces.shared(*files, pad_id=1)
    assert BytePairPieces.shared(*files, pad_id=1) is pieces
    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    (folder / "merges.txt").write_text("\n".join(merges[:-1]) + "\n", encoding="utf-8")  # one merge fewer
    assert BytePairPieces.shared(*files, pad_id=1) is not pieces


def test_ties_go_to_the_pair_of_older_pieces():
    # Every pair occurs once. Ids: x, then ##a ##b ##c ##d (by code point), then each piece
    # as learned; the pair of lowest ids goes first. (tokenizers numbered the ## characters
    # in hash-map order: "xc" came first in some processes.)
    assert learn_pieces({"xab": 1, "xcd": 1}, size=9) == ["x", "##a", "##b", "##c", "##d", "xa", "xc", "xab", "xcd"]
    # The most frequent pair first, whatever its ids.
    assert learn_pieces({"xab": 1, "xcd": 2}, size=6)[-1] == "xc"


def test_learned_pieces_are_those_of_merging_from_scratch_at_every_step():
    """The incremental pair counts (stale word indices, heap entries re-pushed when a
    count falls) give the pieces of recounting every pair after every merge."""
    words = {"aaaa": 3, "aaab": 2, "abab": 4, "baba": 1, "abba": 2, "bbbb": 1, "ab": 5, "ba": 2, "cab": 3, "abc": 1}
    for size in range(6, 30):
        assert learn_pieces(words, size) == _merge_from_scratch(words, size), size


def _merge_from_scratch(counts, size):
    words = {w: [w[0]] + ["##" + c for c in w[1:]] for w in counts}
    ids = {p: i for i, p in enumerate(sorted({p for w in words.values() for p in w}, key=lambda p: (p[:2] == "##", p)))}
    while len(ids) < size:
        pairs = collections.Counter()
        for w, pieces in words.items():
            for pair in zip(pieces, pieces[1:]):
                pairs[pair] += counts[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], ids[p[0]], ids[p[1]]))
        merged = best[0] + best[1].removeprefix("##")
        ids.setdefault(merged, len(ids))
        for w, pieces in words.items():
            out, i = [], 0
            while i < len(pieces):
                if tuple(pieces[i : i + 2]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(pieces[i])
                    i += 1
            words[w] = out
    return list(ids)


def test_word_counts_are_those_of_bert_normalizing_and_splitting_each_text():
    from tokenizers import normalizers, pre_tokenizers

    texts = ["Héllo, wörld!\tNew\nline  two\u00a0spaces", "东京 and Ünïcode's  (brackets)", "", "a.b-c a.b-c ΣΑΣ"]
    for lowercase in (True, False):
        normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=lowercase, strip_accents=lowercase)
        split = pre_tokenizers.BertPreTokenizer().pre_tokenize_str
        expected = collections.Counter(w for t in texts for w, _ in split(normalizer.normalize_str(t)))
        assert word_counts(texts, lowercase) == expected


TRAIN_IN_A_PROCESS = """
import random, sys
from amptrain.data.vocabulary import save_vocabulary, train_vocabulary
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz"
texts = [
    " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(12)) for _ in range(200)
]
save_vocabulary(train_vocabulary(texts, size=400), sys.argv[1])
"""


@pytest.mark.slow
def test_two_processes_learn_the_same_vocabulary_byte_for_byte(tmp_path):
    """Random words, so many equally frequent pairs: the `tokenizers` trainer learned 6
    different vocabularies from these texts in 6 processes."""
    src = os.path.dirname(os.path.dirname(amptrain.__file__))
    paths = []
    for seed in ("1", "2"):
        paths.append(tmp_path / f"vocabulary-{seed}.txt")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
            "PYTHONHASHSEED": seed,
        }
        subprocess.run([sys.executable, "-c", TRAIN_IN_A_PROCESS, str(paths[-1])], env=env, check=True, timeout=300)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert len(paths[0].read_text().splitlines()) == 400
