"""The tokenizers of the families beyond WordPiece, with `data.vocabulary.WordPiece`'s surface
(`size`, `token_id`, `encode`, `graph_tokenize`, and the `_words` forms NER uses), so a
task and its serving graph call any family's the same way.

    tokenizer = BytePairPieces("tiny-roberta/vocab.json", "tiny-roberta/merges.txt", pad_id=1)
    BytePairPieces.shared("tiny-roberta/vocab.json", "tiny-roberta/merges.txt", pad_id=1)  # the process's
    tokenizer.start_id, tokenizer.end_id      # <s> and </s>: amptrain's ids 1 and 2
    tokenizer.encode(["Hello World"])         # [array([44, 327, ...])], no <s> or </s>
    tokenizer.graph_tokenize(tf.constant([...]))   # the same ids, ragged, in TF ops only

Ids are amptrain's: id 0 is padding everywhere in amptrain (its batches pad with 0 and
its masks are `ids != 0`), so a family whose padding piece has another id (RoBERTa's and
XLM-R's `<pad>` is 1, their `<s>` 0) has the two ids swapped here, and swapped back by the
model before its embedding (`families.base.SwapIds`): the swap is its own inverse.
"""

import functools
import hashlib
import json

import numpy as np
import tensorflow as tf

from amptrain.data.vocabulary import NUL_AS_SPACE, nul_as_space


def swapped(ids, pad_id):
    """`ids` with 0 and `pad_id` exchanged (numpy or TensorFlow)."""
    if pad_id == 0:
        return ids
    where = np.where if isinstance(ids, np.ndarray) else tf.where
    return where(ids == 0, pad_id, where(ids == pad_id, 0, ids))


class _Pieces(tf.Module):
    """What every family's tokenizer shares: ids from `_tokenize` (the checkpoint's own ids),
    swapped to amptrain's; `vocabulary` in the checkpoint's id order. A `tf.Module`, so that
    a serving graph holding it saves its tables (keras-hub BPE's cache, the SentencePiece model)."""

    word_prefix = ""  # prepended to each word tokenized on its own (NER)

    def __init__(self, vocabulary, pad_id, specials):
        super().__init__()
        self.vocabulary = list(vocabulary)
        self.pad_id = pad_id
        self._index = {piece: i for i, piece in enumerate(self.vocabulary)}
        # The start, end and unknown pieces' amptrain ids.
        self.start_id, self.end_id, self.unknown_id = (self.token_id(token) for token in specials)
        # One trace for every batch size (keras-hub's BPE graph takes seconds to trace), and
        # no AutoGraph: keras-hub's tokenizers branch on static shapes only, and converting
        # their source costs seconds once a process.
        self._graph = tf.function(
            self.graph_tokenize, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False
        )

    @property
    def size(self):
        return len(self.vocabulary)

    def token_id(self, token):
        return int(swapped(np.array(self._index[token]), self.pad_id))

    def graph_tokenize(self, texts):
        ids = tf.cast(self._tokenize(nul_as_space(texts)), tf.int32)
        return ids.with_flat_values(swapped(ids.flat_values, self.pad_id))

    def graph_form(self):
        """What tokenizes in an export's graph: this tokenizer itself (TensorFlow ops already)."""
        return self

    def graph_tokenize_words(self, words):
        return self.graph_tokenize(tf.strings.join([self.word_prefix, words]) if self.word_prefix else words)

    def encode(self, texts, chunk_size=4096):
        result = []
        for start in range(0, len(texts), chunk_size):
            ragged = self._graph(tf.constant(texts[start : start + chunk_size]))
            flat = ragged.flat_values.numpy().astype(np.int32)
            result.extend(np.split(flat, np.cumsum(ragged.row_lengths().numpy())[:-1]))
        return result

    def encode_words(self, words):
        return self.encode([self.word_prefix + w for w in words])


class BytePairPieces(_Pieces):
    """Byte-level BPE (RoBERTa's `vocab.json` + `merges.txt`), cased. A word on its own is
    tokenized after a space, as `transformers` does for words (`add_prefix_space=True`,
    `is_split_into_words=True`).

    Two implementations of the same pieces: `encode` (training, `eval`, `predict`) is the
    `tokenizers` library's BPE, in time and memory proportional to the text; `graph_tokenize`
    (the export's graph) is keras-hub's BytePairTokenizer in TensorFlow ops, which over the
    spam training split took 15 GB and more than 15 minutes. The tests hold them equal
    (GPT-2's pre-tokenizing pattern in both, no special piece split out of the text)."""

    word_prefix = " "

    def __init__(self, vocabulary_path, merges_path, pad_id, specials=("<s>", "</s>", "<unk>")):
        import keras_hub
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        with open(vocabulary_path, encoding="utf-8") as f:
            vocabulary = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            merges = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#version")]
        self._tokenizer = keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocabulary, merges=merges)
        pairs = [tuple(merge.split(" ")) for merge in merges]
        self._fast = Tokenizer(models.BPE(vocab=vocabulary, merges=pairs))
        self._fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self._fast.decoder = decoders.ByteLevel()
        super().__init__(sorted(vocabulary, key=vocabulary.get), pad_id, specials)

    def _tokenize(self, texts):
        return self._tokenizer.tokenize(texts)

    def decode(self, ids):
        """The text of amptrain's piece ids (byte-level pieces back to UTF-8; bytes that end
        mid-character become U+FFFD, as `transformers` decodes them)."""
        raw = swapped(np.asarray(ids, dtype=np.int32), self.pad_id).tolist()
        return self._fast.decode(raw, skip_special_tokens=False)

    def graph_detokenize(self, ids):
        """`decode` in TensorFlow ops (keras-hub's), for an export: ragged or dense int ids
        (a row a text) -> a string a row."""
        return self._tokenizer.detokenize(swapped(ids, self.pad_id))

    def encode(self, texts, chunk_size=4096):
        """One int32 array of amptrain's piece ids a text, as `graph_tokenize` gives them."""
        result = []
        for start in range(0, len(texts), chunk_size):
            chunk = [text.translate(NUL_AS_SPACE) for text in texts[start : start + chunk_size]]
            encoded = self._fast.encode_batch(chunk, add_special_tokens=False)
            result.extend(swapped(np.array(e.ids, dtype=np.int32), self.pad_id) for e in encoded)
        return result

    @classmethod
    def shared(cls, vocabulary_path, merges_path, pad_id, specials=("<s>", "</s>", "<unk>")):
        """The tokenizer this process built first for files of the same bytes and the same
        `pad_id`, else a new one (kept for the next: the last 8), as `WordPiece.shared`: a new
        one's first call traces and optimizes keras-hub's BPE graph (1.3 s). SentencePieces
        has no such: shared, its TensorFlow Text model resource was gone by the next call
        after a fit (NotFoundError: "SentencepieceResource does not exist")."""
        digest = hashlib.sha256()
        for path in (vocabulary_path, merges_path):
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        return _shared_byte_pairs(vocabulary_path, merges_path, digest.hexdigest(), pad_id, tuple(specials))


class SentencePieces(_Pieces):
    """A SentencePiece model (TensorFlow Text's op, the model's own normalization inside),
    after the normalization `transformers` adds (`lowercase`: ALBERT's `` and '' to ", NFKD,
    accents stripped, lower case). `offset`: XLM-R's ids are the model's plus one, with its
    `<unk>` (0) at 3 and `<s>`, `<pad>`, `</s>`, `<unk>` at 0 to 3 and `<mask>` last (fairseq's
    dictionary, which `transformers` and keras-hub keep)."""

    def __init__(self, model_path, pad_id, specials, lowercase=False, fairseq=False):
        import tensorflow_text as tf_text

        with open(model_path, "rb") as f:
            proto = f.read()
        self._tokenizer = tf_text.SentencepieceTokenizer(model=proto, out_type="int32")
        self._lowercase, self._fairseq = lowercase, fairseq
        size = int(self._tokenizer.vocab_size())
        pieces = [p.decode("utf-8") for p in self._tokenizer.id_to_string(list(range(size))).numpy()]
        if fairseq:
            pieces = ["<s>", "<pad>", "</s>", "<unk>", *pieces[3:], "<mask>"]
        super().__init__(pieces, pad_id, specials)

    def _tokenize(self, texts):
        import tensorflow_text as tf_text

        if self._lowercase:
            texts = tf.strings.regex_replace(texts, "``|''", '"')
            texts = tf.strings.regex_replace(tf_text.normalize_utf8(texts, "NFKD"), r"\p{Mn}", "")
            texts = tf.strings.lower(texts, encoding="utf-8")
        ids = self._tokenizer.tokenize(texts)
        if self._fairseq:
            ids = ids.with_flat_values(tf.where(ids.flat_values == 0, 3, ids.flat_values + 1))
        return ids


@functools.lru_cache(maxsize=8)
def _shared_byte_pairs(vocabulary_path, merges_path, digest, pad_id, specials):
    return BytePairPieces(vocabulary_path, merges_path, pad_id, specials)
