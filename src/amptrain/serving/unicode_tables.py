"""Python's own character classes, made into tables and patterns a TensorFlow graph uses,
so that a served model splits and describes words exactly as `amptrain predict` does.

    starts, values = character_table()          # every code point's `char_id` and its isalpha, isupper… bits
    pattern = character_class(r"\\w")            # an RE2 class of the code points Python's `re` calls \\w
    keys, lowered = lowercase_map()             # code points whose str.lower() differs, and that lower form

`tasks/ner.py` and `tasks/ner_features.py` use `re`, `str.isalpha`, `str.lower` and
`unicodedata`; RE2's `\\w` and `\\s` are ASCII-only, and TensorFlow's case and category
ops follow ICU, whose Unicode version and special cases differ from Python's. So the
classes are computed here, at export time, from the exporting Python over all 1,114,112
code points (about 5 s), and stored in the graph as constants: a table of 3,863 runs and
a class pattern of a few hundred ranges. A model exported under another Python version
follows that version's Unicode tables, as its `amptrain predict` would.
"""

import functools
import re

from amptrain.tasks.ner_features import char_id

LAST_CODE_POINT = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)  # never in UTF-8 text; RE2 refuses them in a class

# The bits above a character's `char_id` (0 to 101, 7 bits) in `character_table`'s values.
CHAR_ID_MASK = 0x7F
ALPHA, UPPER, LOWER, DIGIT, ALNUM = (1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11)


def _code_points():
    return (cp for cp in range(LAST_CODE_POINT + 1) if cp not in SURROGATES)


def character_value(c):
    """`char_id(c)` and c's isalpha, isupper, islower, isdigit, isalnum as bits above it."""
    flags = (c.isalpha(), c.isupper(), c.islower(), c.isdigit(), c.isalnum())
    return char_id(c) | sum(bit for bit, on in zip((ALPHA, UPPER, LOWER, DIGIT, ALNUM), flags) if on)


@functools.cache
def character_table():
    """(run starts, run values): code point `cp` has the value of the last run starting at
    or before it (`tf.searchsorted(starts, cp, "right") - 1`). Surrogates take value 0."""
    starts, values, previous = [], [], None
    for cp in range(LAST_CODE_POINT + 1):
        value = 0 if cp in SURROGATES else character_value(chr(cp))
        if value != previous:
            starts.append(cp)
            values.append(value)
            previous = value
    return starts, values


@functools.cache
def character_class(python_pattern):
    """An RE2 bracket expression matching the code points Python's `re` matches with
    `python_pattern` (one character, e.g. `\\w` or `\\s`)."""
    matcher = re.compile(python_pattern)
    ranges, start, previous = [], None, None
    for cp in _code_points():
        if matcher.fullmatch(chr(cp)):
            if start is None or cp != previous + 1:
                if start is not None:
                    ranges.append((start, previous))
                start = cp
            previous = cp
    if start is not None:
        ranges.append((start, previous))
    return "[" + "".join(_range(a, b) for a, b in ranges) + "]"


def negated_class(python_pattern):
    """The RE2 bracket expression of the code points `python_pattern` does not match."""
    return "[^" + character_class(python_pattern)[1:]


def _range(first, last):
    return f"\\x{{{first:x}}}" if first == last else f"\\x{{{first:x}}}-\\x{{{last:x}}}"


@functools.cache
def lowercase_map():
    """(code points, their str.lower()): every code point whose lower-case form differs
    (1,433 under Python 3.11; one, U+0130, lowers to two characters)."""
    keys, lowered = [], []
    for cp in _code_points():
        c = chr(cp)
        if c.lower() != c:
            keys.append(cp)
            lowered.append(c.lower())
    return keys, lowered
