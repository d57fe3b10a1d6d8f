"""Translation's output pieces back to text, as `amptrain predict` and the export's graph
(`serving.py`, which takes its tables from these rules) both write it.

    detokenize(["el", "gato", "##s", "."])   # "el gatos."
"""

import numpy as np

from amptrain.data.vocabulary import PAD_ID

# Pieces a detokenised text joins to the word before (closing punctuation) or after
# (opening punctuation, Spanish's inverted marks), and to both (apostrophes, hyphens).
JOIN_BEFORE = set(".,;:!?)]}»”’%")
JOIN_AFTER = set("([{«“¿¡")
JOIN_BOTH = set("'-")


def until_end(pieces, end_id):
    """The ids of `pieces` (a numpy row) before the first `end_id`, padding left out."""
    ends = np.flatnonzero(pieces == end_id)
    pieces = pieces[: ends[0]] if len(ends) else pieces
    return [int(p) for p in pieces if p != PAD_ID]


def detokenize(pieces):
    """WordPiece pieces back to text: `##` pieces join the piece before; punctuation joins
    its word as written (closing marks the word before, opening ones the word after)."""
    text = ""
    join_next = True
    for piece in pieces:
        if piece.startswith("##"):
            text += piece[2:]
            continue
        joins = join_next or piece in JOIN_BEFORE or piece in JOIN_BOTH
        text += piece if joins else " " + piece
        join_next = piece in JOIN_AFTER or piece in JOIN_BOTH
    return text
