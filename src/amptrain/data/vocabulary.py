"""WordPiece vocabularies: trained on the training split or loaded, and the tokenizer.

    vocabulary = train_vocabulary(texts, size=8000, lowercase=True)
    tokenizer = WordPiece(vocabulary, lowercase=True)
    ids = tokenizer.encode(["see you at lunch"])  # [array([  ... ], dtype=int32)]

Training uses the `tokenizers` package; tokenizing uses keras-hub's
`WordPieceTokenizer` (tensorflow-text ops), the tokenizer a served model runs in its
graph. keras-hub's own trainer (`compute_word_piece_vocabulary`) took 156 s on the
4,838 spam texts on a 2-core CPU; `tokenizers` takes under 2 s for the same vocabulary
format (`##` continuation pieces).
"""

import numpy as np

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
RESERVED_TOKENS = [PAD, UNK, CLS, SEP, MASK]
PAD_ID = 0


def train_vocabulary(texts, size, lowercase=True):
    """Learns a WordPiece vocabulary of at most `size` pieces, padded to a multiple of 8."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=RESERVED_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    # The trainer's id order changes from process to process (hash-map order; the set
    # of pieces was the same in every trial): sort, so a run's vocabulary, and so its
    # model, is a function of its data alone.
    learned = sorted(set(tokenizer.get_vocab()) - set(RESERVED_TOKENS))
    return pad_to_multiple(RESERVED_TOKENS + learned, 8)


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
        self._tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary, lowercase=lowercase, strip_accents=lowercase, oov_token=UNK
        )
        # Eager keras-hub tokenizing converts every id to a Python int (13 s for the
        # spam training split); one graph call returning a ragged tensor takes ~1.5 s.
        self._tokenize = tf.function(self._tokenizer.tokenize)

    @property
    def size(self):
        return len(self.vocabulary)

    def token_id(self, token):
        return self.vocabulary.index(token)

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
