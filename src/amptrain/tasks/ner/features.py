"""The word features of the NER task, computed in numpy from the words themselves: the
alignment of words to pieces, each piece's word shape and case bucket, and its word's characters.

    ids, firsts, truncated = align(word_pieces, max_length=128, cls_id=2)
    piece_shapes(words, ids, firsts, lowercase_counts)   # one shape id a piece
    piece_chars(words, ids, firsts)                      # (pieces, CHARS_PER_WORD) character ids

Why each exists, and what it added on WNUT-17: docs/architecture.md, "Named-entity tagging".
"""

import re
import unicodedata

import numpy as np

# Words of a raw text given to `predict`: a URL, an @mention or #hashtag, a run of letters
# and digits (with inner apostrophes, hyphens or dots: "don't", "e-mail", "U.S"), or any
# other single character. (WNUT's own tokens split "it's" into "it" and "'s".)
WORD = re.compile(r"https?://\S+|[@#]?\w+(?:['’.-]\w+)*|\S")

SHAPES = ("lower", "title", "caps", "mixed", "number", "punctuation", "url", "mention", "hashtag")
# 0: [CLS] and padding; then each shape at the sentence start or not (18 ids), times the 3
# case buckets (`case_bucket`): 55 ids, the table padded to a multiple of 8 (tensor cores;
# `amptrain audit` checks it).
NUM_SHAPES = 56


def word_shape(word, sentence_start):
    """The id of `word`'s shape (see SHAPES), from 1 to 2 * len(SHAPES)."""
    letters = [c for c in word if c.isalpha()]
    if word.startswith(("http:", "https:", "www.")):
        shape = "url"
    elif len(word) > 1 and word[0] in "@#" and word[1:2].isalnum():
        shape = "mention" if word[0] == "@" else "hashtag"
    elif letters and all(c.isupper() for c in letters):
        shape = "caps" if len(letters) > 1 else "title"
    elif letters and letters[0].isupper() and all(c.islower() for c in letters[1:]):
        shape = "title"
    elif letters:
        shape = "mixed" if any(c.isupper() for c in letters) else "lower"
    else:
        shape = "number" if any(c.isdigit() for c in word) else "punctuation"
    return 1 + SHAPES.index(shape) + (len(SHAPES) if sentence_start else 0)


# Characters: a fixed table, the same for every run (nothing to learn or save). 0 pads;
# 1 and 2 mark a word's start and end; printable ASCII but the space (33 to 126) is 3 to 96;
# any other character is its accent-stripped ASCII letter when it has one (é is e), else
# its class: an upper-case letter, a lower-case letter, a letter without case, a digit,
# anything else (emoji, symbols). 102 ids, the table padded to a multiple of 8.
CHARS_PER_WORD = 20
NUM_CHARS = 104
_OTHER_CHARS = {"Lu": 97, "Ll": 98, "Lt": 97, "Lm": 99, "Lo": 99, "Nd": 100}


def char_id(c):
    if 33 <= ord(c) <= 126:
        return ord(c) - 30
    base = unicodedata.normalize("NFKD", c)[:1]
    if base and 33 <= ord(base) <= 126 and base.isalpha():
        return ord(base) - 30
    return _OTHER_CHARS.get(unicodedata.category(c), 101)


def word_chars(word, size=CHARS_PER_WORD):
    """The character ids of `word` between its start and end marks, padded with 0 to `size`;
    a longer word keeps its first and last (size - 2) // 2 characters (prefixes and suffixes)."""
    keep = size - 2
    if len(word) > keep:
        word = word[: keep // 2] + word[len(word) - (keep - keep // 2) :]
    ids = np.zeros(size, np.int32)
    ids[: len(word) + 2] = [1, *(char_id(c) for c in word), 2]
    return ids


def piece_chars(words, ids, firsts):
    """(pieces, CHARS_PER_WORD): every piece carries its word's characters; [CLS] all 0."""
    chars = np.zeros((len(ids), CHARS_PER_WORD), np.int8)
    ends = list(firsts[1:]) + [len(ids)]
    for i, (start, end) in enumerate(zip(firsts, ends)):
        chars[start:end] = word_chars(words[i])
    return chars


def case_bucket(word, lowercase_counts):
    """0, 1 or 2: how often a word with capitals was seen all lower-case in the training
    split (never, 1 to 4 times, 5 or more); 0 for a word without capitals."""
    if lowercase_counts is None or word == word.lower():
        return 0
    count = lowercase_counts.get(word.lower(), 0)
    return 0 if count == 0 else 1 if count < 5 else 2


def piece_shapes(words, ids, firsts, lowercase_counts=None):
    """The shape id of every piece: its word's; 0 for [CLS] (and, later, padding)."""
    shapes = np.zeros(len(ids), np.int32)
    ends = list(firsts[1:]) + [len(ids)]
    for i, (start, end) in enumerate(zip(firsts, ends)):
        shapes[start:end] = word_shape(words[i], i == 0) + 2 * len(SHAPES) * case_bucket(words[i], lowercase_counts)
    return shapes


def align(word_pieces, max_length, cls_id):
    """[CLS] and the pieces of as many whole words as fit into `max_length`.

    Returns (piece ids, the position of each kept word's first piece, words truncated)."""
    ids, firsts = [cls_id], []
    for pieces in word_pieces:
        if len(ids) + len(pieces) > max_length:
            break
        firsts.append(len(ids))
        ids.extend(pieces)
    return np.array(ids, np.int32), np.array(firsts, np.int64), len(word_pieces) - len(firsts)
