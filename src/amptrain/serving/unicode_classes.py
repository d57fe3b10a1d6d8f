"""Python's own character classes as RE2 patterns and tables a TensorFlow graph uses, so
that a served model splits and lowercases text exactly as `amptrain predict` does.

    pattern = character_class(r"\\w")            # an RE2 class of the code points Python's `re` calls \\w
    keys, lowered = lowercase_map()             # code points whose str.lower() differs, and that lower form

The tasks use `re`, `str.lower` and `unicodedata`; RE2's `\\w` and `\\s` are ASCII-only, and
TensorFlow's case and category ops follow ICU, whose Unicode version and special cases
differ from Python's. So the classes are computed here, at export time, from the exporting
Python over all 1,114,112 code points, and stored in the graph as constants (a class
pattern of a few hundred ranges). A model exported under another Python version follows
that version's Unicode tables, as its `amptrain predict` would. A task's own tables (the NER
task's character ids: `tasks/ner/character_table.py`) are built the same way.
"""

import functools
import re

LAST_CODE_POINT = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)  # never in UTF-8 text; RE2 refuses them in a class


def _code_points():
    return (cp for cp in range(LAST_CODE_POINT + 1) if cp not in SURROGATES)


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
