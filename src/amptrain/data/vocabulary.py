"""WordPiece vocabularies: trained on the training split or loaded, and the tokenizer.

    vocabulary = train_vocabulary(texts, size=8000, lowercase=True)
    tokenizer = WordPiece(vocabulary, lowercase=True)
    ids = tokenizer.encode(["see you at lunch"])  # [array([  ... ], dtype=int32)]
    tokenizer = WordPiece.shared(vocabulary)      # the process's one of this vocabulary

Training splits words with the `tokenizers` package (BERT's normalizer and
pre-tokenizer) and learns the pieces here, the way its WordPiece trainer does but with
ties between equally frequent merges broken the same way in every process (its trainer's
order changed from process to process); tokenizing uses keras-hub's `WordPieceTokenizer`
(tensorflow-text ops), the tokenizer a served model runs in its graph. keras-hub's own
trainer (`compute_word_piece_vocabulary`) took 156 s on the 4,838 spam texts on a 2-core
CPU; the `tokenizers` trainer under 2 s, this one 1.1 to 1.3 times as long.
"""

import collections
import functools
import heapq

import numpy as np

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
RESERVED_TOKENS = [PAD, UNK, CLS, SEP, MASK]
PAD_ID = 0


def train_vocabulary(texts, size, lowercase=True):
    """Learns a WordPiece vocabulary of at most `size` pieces, padded to a multiple of 8:
    the reserved tokens, then the learned pieces sorted.

    The words are BERT's (`word_counts`); the pieces are learned as the `tokenizers`
    WordPiece trainer learns them, but here (`learn_pieces`), so that equally frequent
    merges are chosen in the same order in every process: the same texts give the same
    vocabulary, byte for byte."""
    learned = learn_pieces(word_counts(texts, lowercase), size - len(RESERVED_TOKENS))
    return pad_to_multiple(RESERVED_TOKENS + sorted(set(learned) - set(RESERVED_TOKENS)), 8)


def word_counts(texts, lowercase=True):
    """How often each word occurs in `texts`, split as BERT does (the BertNormalizer and
    BertPreTokenizer of `tokenizers`). Both act a character at a time and split at every
    space, so each distinct space-separated chunk is normalized and split once; a chunk of
    letters and digits alone is one word."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=lowercase, strip_accents=lowercase)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    chunks = collections.Counter()
    for text in texts:
        chunks.update(text.split(" "))
    counts = collections.Counter()
    for chunk, count in chunks.items():
        for part in normalizer.normalize_str(chunk).split(" "):
            if part.isalnum():
                counts[part] += count
            else:
                for word, _ in pre_tokenizer.pre_tokenize_str(part):
                    counts[word] += count
    return counts


def learn_pieces(counts, size):
    """At most `size` pieces learned from `counts` (word -> count) by byte-pair merges, as
    the `tokenizers` WordPiece trainer learns them (its BPE trainer with `##` on pieces
    that continue a word): start from the characters; merge the most frequent adjacent pair
    of pieces, in every word, into a new piece; repeat until there are `size` pieces or no
    pairs. Equally frequent pairs (many, among rare ones) go by the pieces' ids, as there:
    the pair of older pieces first. Ids go to the characters, then the `##` characters,
    each by code point, then to pieces as they are learned; `tokenizers` numbers the `##`
    characters in a hash map's order, which changes from process to process."""
    return list(_learn(_Merges(counts), size).ids)


def learn_byte_pairs(counts, size, alphabet):
    """(pieces in id order, merges in the order learned): a byte-level BPE of at most `size`
    pieces learned from `counts` (pre-tokenized words, each a string of `alphabet`'s
    characters, as GPT-2's byte-to-character map writes bytes) the way `learn_pieces` learns
    WordPiece's: the same merges in every process. Every character of `alphabet` is a piece,
    so any text has pieces."""
    merges = _learn(_Merges(counts, continuation="", alphabet=alphabet), size)
    return list(merges.ids), merges.learned


def _learn(merges, size):
    heap = [merges.entry(pair) for pair in merges.pair_counts]
    heapq.heapify(heap)
    while len(merges.ids) < size and heap:
        count, _, _, pair = heapq.heappop(heap)
        current = merges.pair_counts.get(pair)
        if current == -count:
            for risen in merges.merge(pair):
                heapq.heappush(heap, merges.entry(risen))
        elif current:  # the count fell since: every pair keeps an entry at least its count
            heapq.heappush(heap, merges.entry(pair))
    return merges


class _Merges:
    """The training words as lists of pieces, the count of every adjacent pair, the pieces'
    ids and the merges learned. `continuation`: the mark of a piece that continues a word
    (WordPiece's "##"; "" for byte-level BPE); `alphabet`: characters that are pieces from
    the start, seen or not."""

    def __init__(self, counts, continuation="##", alphabet=()):
        self.continuation = continuation
        self.words = [[w[0]] + [continuation + c for c in w[1:]] for w in sorted(counts)]
        self.frequency = [counts[w] for w in sorted(counts)]
        pieces = {piece for word in self.words for piece in word} | set(alphabet)
        pieces = sorted(pieces, key=lambda p: (bool(continuation) and p.startswith(continuation), p))
        self.ids = {piece: i for i, piece in enumerate(pieces)}
        self.learned = []  # the merged pairs, in order
        self.pair_counts = collections.Counter()
        self.where = collections.defaultdict(set)  # pair -> indices of the words that may hold it
        for i, word in enumerate(self.words):
            for pair in zip(word, word[1:]):
                self.pair_counts[pair] += self.frequency[i]
                self.where[pair].add(i)

    def entry(self, pair):
        """`pair`'s heap entry: the most frequent first, then the one of lower ids."""
        return -self.pair_counts[pair], self.ids[pair[0]], self.ids[pair[1]], pair

    def merge(self, pair):
        """Merges `pair` in every word into a new piece; returns the pairs whose count rose."""
        merged = pair[0] + (pair[1].removeprefix(self.continuation) if self.continuation else pair[1])
        self.ids.setdefault(merged, len(self.ids))
        self.learned.append(pair)
        change = collections.defaultdict(int)
        for i in self.where.pop(pair):
            self.words[i] = self._merge_word(i, pair, merged, change)
        del self.pair_counts[pair]
        risen = []
        for changed, delta in change.items():
            if delta and changed != pair:
                self.pair_counts[changed] += delta
                if delta > 0:
                    risen.append(changed)
                elif self.pair_counts[changed] <= 0:
                    del self.pair_counts[changed]
        return risen

    def _merge_word(self, i, pair, merged, change):
        """Word `i` with each `pair`, left to right, replaced by `merged`; the pairs lost and
        formed go into `change` (pair -> count change), as in tokenizers' `Word::merge`."""
        word, (first, second), weight = self.words[i], pair, self.frequency[i]
        if first not in word:  # `where` may name words that no longer hold the pair
            return word
        result, start = [], 0
        while True:
            try:
                j = word.index(first, start)
            except ValueError:
                break
            if j + 1 == len(word) or word[j + 1] != second:
                result.extend(word[start : j + 1])
                start = j + 1
                continue
            result.extend(word[start:j])
            if result:
                change[result[-1], first] -= weight
                change[result[-1], merged] += weight
                self.where[result[-1], merged].add(i)
            if j + 2 < len(word):
                change[second, word[j + 2]] -= weight
                change[merged, word[j + 2]] += weight
                self.where[merged, word[j + 2]].add(i)
            result.append(merged)
            start = j + 2
        return result + word[start:]


def pad_to_multiple(vocabulary, multiple):
    """Adds `[unusedN]` pieces so the embedding's row count is a multiple of `multiple`
    (tensor cores and XLA tile better on such shapes)."""
    vocabulary = list(vocabulary)
    missing = -len(vocabulary) % multiple
    return vocabulary + [f"[unused{i}]" for i in range(missing)]


def save_vocabulary(vocabulary, path):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(vocabulary) + "\n")


def load_vocabulary(path):
    from amptrain.data.readers import read_lines
    from amptrain.errors import DataError

    vocabulary = read_lines(path, lambda f: [line.rstrip("\r\n") for line in f if line.rstrip("\r\n")])
    for token in (PAD, UNK):
        if token not in vocabulary:
            raise DataError(f"{path}: the vocabulary has no {token} piece; expected BERT-style reserved tokens")
    if vocabulary[0] != PAD:
        raise DataError(f"{path}:1: expected {PAD} as the first piece (id 0 is padding), received {vocabulary[0]!r}")
    return vocabulary


class WordPiece:
    """keras-hub's WordPiece tokenizer run as one graph over a whole list of texts."""

    def __init__(self, vocabulary, lowercase=True):
        import keras_hub
        import tensorflow as tf

        self.vocabulary = list(vocabulary)
        # keras-hub lower-cases by Unicode case folding, which makes "ß" "ss"; BERT's tokenizer
        # (and `transformers`') lower-cases, keeping "ß": so the lower-casing is done here.
        self._lowercase = lowercase
        self._tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary, lowercase=False, strip_accents=lowercase, oov_token=UNK
        )
        # Eager keras-hub tokenizing converts every id to a Python int (13 s for the
        # spam training split); one graph call returning a ragged tensor takes ~1.5 s.
        # One signature for any number of texts: traced once (0.6 s), not once a split's
        # length; no AutoGraph: keras-hub's tokenizer branches on static shapes only, and
        # converting its source took 3-6 s in every process that tokenized.
        self._tokenize = tf.function(
            self._lowered_tokenize, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False
        )

    @classmethod
    def shared(cls, vocabulary, lowercase=True):
        """The tokenizer of `vocabulary` and casing that this process built first, else a
        new one (kept for the next: the last 8). Tokenizing is a pure function of the two,
        and a new tokenizer's first call traces and optimizes its graph (about 0.1 s, each
        fit, `eval`, `predict` and export of a run built one): a process that fits and
        then scores, predicts or exports the same run, or runs many, traces it once."""
        return _shared_wordpiece(tuple(vocabulary), lowercase)

    def _lowered_tokenize(self, texts):
        import tensorflow as tf

        texts = nul_as_space(texts)
        return self._tokenizer.tokenize(tf.strings.lower(texts, encoding="utf-8") if self._lowercase else texts)

    @property
    def size(self):
        return len(self.vocabulary)

    def token_id(self, token):
        return self.vocabulary.index(token)

    def graph_tokenize(self, texts):
        """Piece ids of a string tensor as a ragged int32 tensor, in TensorFlow and
        TensorFlow Text ops only: an export (`amptrain.serving`) calls this inside the graph
        it saves, so a served model tokenizes exactly as `encode` does."""
        return self._tokenize(texts)

    def graph_tokenize_words(self, words):
        """`graph_tokenize` of words each on its own (NER): the same for WordPiece."""
        return self.graph_tokenize(words)

    def encode_words(self, words):
        return self.encode(words)

    @property
    def start_id(self):
        return self.token_id(CLS)

    @property
    def end_id(self):
        return self.token_id(SEP)

    @property
    def unknown_id(self):
        return self.token_id(UNK)

    def encode(self, texts, chunk_size=4096):
        """Returns one int32 array of piece ids per text."""
        import tensorflow as tf

        result = []
        for start in range(0, len(texts), chunk_size):
            ragged = self._tokenize(tf.constant(texts[start : start + chunk_size]))
            flat = ragged.flat_values.numpy().astype(np.int32)
            lengths = ragged.row_lengths().numpy()
            result.extend(np.split(flat, np.cumsum(lengths)[:-1]))
        return result


def nul_as_space(texts):
    """A string tensor with each NUL character a space. TensorFlow's UTF-8 string ops
    (`tf.strings.lower`, TensorFlow Text's regex split) end a text at its first NUL, so
    "a\\0<a spam mail>" was read as "a". A space, not nothing (BERT's normaliser drops NUL):
    every other character keeps its place, so the tagger's character offsets hold; Python's
    side of the same text says `NUL_AS_SPACE`."""
    import tensorflow as tf

    return tf.strings.regex_replace(texts, r"\x00", " ")


NUL_AS_SPACE = str.maketrans({"\0": " "})  # `text.translate(NUL_AS_SPACE)`: `nul_as_space` in Python


@functools.lru_cache(maxsize=8)
def _shared_wordpiece(vocabulary, lowercase):
    return WordPiece(vocabulary, lowercase)
