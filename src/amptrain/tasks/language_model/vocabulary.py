"""The language model's byte-level BPE: learned from the training text, the same pieces for
the same text in every process, saved as GPT-2's `vocab.json` and `merges.txt`.

    pieces, merges = learn(documents(files), size=4096)
    save(pieces, merges, run_dir)
    tokenizer = load(run_dir)        # models.families.tokenizers.BytePairPieces

Words are split and their bytes written as characters by GPT-2's pre-tokenizer (the
`tokenizers` library's ByteLevel: "And God" -> "And", "ĠGod"); the merges are learned by
`data.vocabulary.learn_byte_pairs`, equally frequent pairs by their pieces' ids, as
WordPiece's are. Id 0 is padding and id 1 the end of a document; then the 256 byte
characters, then the merged pieces. The tokenizer reads the two files: the `tokenizers`
library's BPE where training and `predict` tokenize, keras-hub's in the export's graph.
"""

import collections
import json
import os

from amptrain.data.vocabulary import learn_byte_pairs

PAD, EOD = "<pad>", "<|endoftext|>"
VOCABULARY_FILE, MERGES_FILE = "vocab.json", "merges.txt"
RECORD = "vocabulary-made-from.json"  # the training files and size the vocabulary was learned from
BASE_PIECES = 2 + 256  # padding, the end of a document and the 256 byte characters


def word_counts(texts):
    """How often each byte-level word occurs in `texts` (GPT-2's split)."""
    from tokenizers import pre_tokenizers

    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    counts = collections.Counter()
    for text in texts:
        counts.update(word for word, _ in split.pre_tokenize_str(text))
    return counts


def learn(texts, size):
    """(pieces in id order, merges): `size` pieces at most, the two reserved ones first."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pieces, merges = learn_byte_pairs(word_counts(texts), size - 2, alphabet)
    return [PAD, EOD, *pieces], merges


def save(pieces, merges, run_dir):
    with open(os.path.join(run_dir, VOCABULARY_FILE), "w", encoding="utf-8") as f:
        json.dump({piece: i for i, piece in enumerate(pieces)}, f, ensure_ascii=False)
    with open(os.path.join(run_dir, MERGES_FILE), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def load(run_dir):
    """The tokenizer of the run folder's two files (ids as they are: padding is id 0)."""
    from amptrain.models.families.tokenizers import BytePairPieces

    return BytePairPieces.shared(
        os.path.join(run_dir, VOCABULARY_FILE), os.path.join(run_dir, MERGES_FILE), pad_id=0, specials=(EOD, EOD, EOD)
    )


def learned_from(run_dir, made_from):
    """True when the run's vocabulary was learned from `made_from` (or is an older run's, which
    recorded nothing, with checkpoints); False when it is to be learned again; refuses one
    that checkpoints index but other files would make."""
    import glob

    from amptrain.errors import DataError

    try:
        with open(os.path.join(run_dir, RECORD), encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        recorded = None
    if recorded == made_from:
        return True
    if not glob.glob(os.path.join(glob.escape(run_dir), "checkpoints", "ckpt-*.index")):
        return False  # nothing trained with it: learned again
    if recorded is None:
        return True
    changed = [f["path"] for f in made_from["files"] if f not in recorded.get("files", [])]
    raise DataError(
        f"{run_dir}: the run's vocabulary was learned from other training data "
        f"({', '.join(changed) or 'data.vocabulary_size'} changed since) and its checkpoints index it; put "
        "the original data back, or start afresh (--overwrite, or --run-dir a new folder)"
    )
