"""Every code point's character id (`features.char_id`) and its isalpha, isupper, islower,
isdigit and isalnum bits, as runs a TensorFlow graph searches: the NER export describes
words exactly as `amptrain predict` does (`serving/unicode_classes.py` says why Python's
tables and not TensorFlow's).

    starts, values = character_table()   # 3,863 runs; a code point takes its run's value
"""

import functools

from amptrain.serving.unicode_classes import LAST_CODE_POINT, SURROGATES
from amptrain.tasks.ner.features import char_id

# The bits above a character's `char_id` (0 to 101, 7 bits) in `character_table`'s values.
CHAR_ID_MASK = 0x7F
ALPHA, UPPER, LOWER, DIGIT, ALNUM = (1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11)


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
