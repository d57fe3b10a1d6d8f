"""A causal language model's tokenizer in TensorFlow ops, for an export's graph: the same ids
as the folder's tokenizer.json (`tokenizer.HubPieces`), without Python.

    graph = graph_tokenizer(tokenizer)          # ByteLevelGraph or SentencePieceGraph
    graph.graph_tokenize(tf.constant(["Hello"]))   # ragged ids, no special piece added
    graph.graph_detokenize(ids)                    # a string a row, special pieces skipped

Byte-level BPE (GPT-2, Llama 3, Qwen2): the text is split into words by the tokenizer.json's
own pattern, then keras-hub's BytePairTokenizer merges each word. keras-hub's graph splits
every model with GPT-2's pattern (Llama 3's digits in threes, Qwen2's one digit a piece
and whitespace runs then came out otherwise); here the pattern is the folder's, run by
RE2, which has no lookahead: `\\s+(?!\\S)` (a whitespace run but its last character when a
word follows) is had by marking that last character (`MARK`) before the split and dropping
the mark after. `\\s` is Unicode whitespace, as in `tokenizers`' regex (RE2's is ASCII).
Special pieces in a text stay whole (keras-hub's unsplittable tokens); `ignore_merges`
(Llama 3: a word in the vocabulary is one piece) is had by caching every piece as itself.
Gemma's SentencePiece model (`tokenizer.model`) runs as TensorFlow Text's op.
"""

import json
import os
import re

import tensorflow as tf

from amptrain.errors import UserError

MARK = "\ue000"  # a private-use character: not whitespace, letter or number
WHITESPACE = r"\t\n\x{0b}\f\r \x{85}\p{Z}"  # Unicode's White_Space, as `tokenizers`' \s
LOOKAHEAD = r"\s+(?!\S)|"
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def split_pattern(pre_tokenizer, path):
    """The RE2 pattern of a tokenizer.json's byte-level pre-tokenizer (see the module docstring)."""
    pattern = None
    if pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True):
        pattern = GPT2_PATTERN
    elif pre_tokenizer.get("type") == "Sequence":
        steps = pre_tokenizer.get("pretokenizers") or []
        kinds = [step.get("type") for step in steps]
        if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
            pattern = (steps[0].get("pattern") or {}).get("Regex")
    if not pattern or LOOKAHEAD not in pattern or re.search(r"\(\?<?[=!]", pattern.replace(LOOKAHEAD, "")):
        raise UserError(
            f"{path}: a pre-tokenizer this export cannot run in a graph ({json.dumps(pre_tokenizer)[:120]})"
        )
    return unicode_whitespace(pattern.replace(LOOKAHEAD, ""))


def unicode_whitespace(pattern):
    """`pattern` with RE2's ASCII `\\s` and `\\S` made Unicode's, inside character classes too."""
    out, inside, i = [], False, 0
    while i < len(pattern):
        two = pattern[i : i + 2]
        if two in (r"\s", r"\S"):
            if inside and two == r"\S":  # a class of "not whitespace" inside another: none seen
                raise UserError(f"a split pattern this export cannot run in a graph: {pattern[:120]}")
            if inside:
                out.append(WHITESPACE)
            else:
                out.append(f"[{WHITESPACE}]" if two == r"\s" else f"[^{WHITESPACE}]")
            i += 2
            continue
        if pattern[i] == "\\":
            out.append(two)
            i += 2
            continue
        inside = True if pattern[i] == "[" else False if pattern[i] == "]" else inside
        out.append(pattern[i])
        i += 1
    return "".join(out)


class ByteLevelGraph(tf.Module):
    def __init__(self, path, specials):
        import keras_hub

        with open(path, encoding="utf-8") as f:
            tokenizer = json.load(f)
        normalizer = tokenizer.get("normalizer")
        if normalizer not in (None, {"type": "NFC"}):
            raise UserError(f"{path}: a normalizer this export cannot run in a graph ({json.dumps(normalizer)[:120]})")
        self._nfc = normalizer is not None
        self._pattern = split_pattern(tokenizer.get("pre_tokenizer") or {}, path)
        model = tokenizer["model"]
        vocabulary = dict(model["vocab"])
        vocabulary.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens") or []})
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        self._specials = [t["content"] for t in tokenizer.get("added_tokens") or []]
        self._bpe = keras_hub.tokenizers.BytePairTokenizer(
            vocabulary=vocabulary, merges=merges, unsplittable_tokens=self._specials
        )
        if model.get("ignore_merges"):  # a word that is a piece is that piece, merges or not
            pieces = [p for p in model["vocab"] if p not in self._specials]
            self._bpe.cache.insert(_raw_bytes(pieces), pieces)
        self._skipped = tf.constant(sorted(specials), tf.int32)

    def split(self, texts):
        """The words of each text, ragged (batch, words), as the tokenizer.json's pattern splits:
        each special piece cut out first (a word of its own), standing in the split for a
        string of private-use characters the pattern keeps whole."""
        import tensorflow_text as tf_text

        if self._nfc:
            texts = tf_text.normalize_utf8(texts, "NFC")
        texts = tf.strings.regex_replace(texts, f"[{MARK}-{chr(0xE000 + 1 + len(self._specials))}]", "")
        texts = tf.strings.regex_replace(texts, rf"([{WHITESPACE}])([^{WHITESPACE}])", MARK + r"\1\2")
        alternates = [f"{MARK}{chr(0xE001 + i)}" for i in range(len(self._specials))]
        for special, alternate in zip(self._specials, alternates):
            texts = tf_text.regex_split(texts, re.escape(special), re.escape(special))
            texts = tf.strings.regex_replace(texts, re.escape(special), alternate)
        words = tf_text.regex_split(texts, self._pattern, self._pattern)
        while words.shape.rank > 2:
            words = words.merge_dims(1, 2)
        for special, alternate in zip(self._specials, alternates):
            words = tf.ragged.map_flat_values(tf.strings.regex_replace, words, f"^{alternate}$", special)
        words = tf.ragged.map_flat_values(tf.strings.regex_replace, words, MARK, "")
        return tf.ragged.boolean_mask(words, words != "")

    def graph_tokenize(self, texts):
        """Ragged int32 ids, a row a text (keras-hub's merges over the words of `split`)."""
        bpe = self._bpe
        bpe._maybe_initialized_tf()
        words = self.split(texts)
        flat = words.flat_values
        found = bpe.cache.lookup(flat)
        unseen = tf.reduce_any((found == "") & (flat != ""))

        def merged():
            bpe._bpe_merge_and_update_cache_tf(tf.boolean_mask(flat, found == ""))
            return bpe.cache.lookup(flat)

        pieces = tf.strings.split(tf.cond(unseen, merged, lambda: found), sep=" ")
        ids = tf.cast(bpe.token_to_id_map.lookup(pieces), tf.int32)
        return tf.RaggedTensor.from_row_splits(ids.flat_values, tf.gather(ids.row_splits, words.row_splits))

    def graph_detokenize(self, ids):
        return self._bpe.detokenize(_without(ids, self._skipped))


class SentencePieceGraph(tf.Module):
    """Gemma's `tokenizer.model` (TensorFlow Text's op; its byte fallback and digit split inside)."""

    def __init__(self, path, specials):
        import tensorflow_text as tf_text

        with open(path, "rb") as f:
            self._model = tf_text.SentencepieceTokenizer(model=f.read(), out_type=tf.int32)
        self._skipped = tf.constant(sorted(specials), tf.int32)

    def graph_tokenize(self, texts):
        return self._model.tokenize(texts)

    def graph_detokenize(self, ids):
        return self._model.detokenize(_without(ids, self._skipped))


def graph_tokenizer(tokenizer):
    """The graph form of a `HubPieces` (its folder's tokenizer.json, or Gemma's tokenizer.model)."""
    folder = os.path.dirname(tokenizer.path)
    with open(tokenizer.path, encoding="utf-8") as f:
        model = json.load(f)["model"]
    if model.get("type") == "BPE" and not model.get("byte_fallback"):
        return ByteLevelGraph(tokenizer.path, tokenizer.special_ids)
    model = os.path.join(folder, "tokenizer.model")
    if os.path.isfile(model):
        return SentencePieceGraph(model, tokenizer.special_ids)
    raise UserError(f"{tokenizer.path}: no graph form of this tokenizer (byte-level BPE, or a tokenizer.model)")


def _without(ids, skipped):
    """Ragged `ids` less the special pieces (`transformers`' `skip_special_tokens`)."""
    return tf.ragged.boolean_mask(ids, tf.reduce_all(ids[..., None] != skipped, axis=-1))


def _raw_bytes(pieces):
    """The bytes each byte-level piece stands for (GPT-2's byte-to-character table, inverted)."""
    from keras_hub.src.tokenizers.byte_pair_tokenizer import bytes_to_unicode

    table = dict(zip(*reversed(bytes_to_unicode())))
    return [b"".join(table.get(c, c.encode("utf-8")) for c in piece) for piece in pieces]
