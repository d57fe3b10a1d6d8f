"""Named-entity tagging: CoNLL `token<TAB>tag` files in, entity-level precision, recall and F1 out.

    task = NerTask(config, run_dir)
    task.prepare()                                   # read, learn the vocabulary and tags, align
    model = task.build_model(dtype="mixed_bfloat16")
    dataset = task.train_dataset(start_step=0)       # the engine pulls from this
    task.predict_texts(predict, ["Empire State Building = ESB"])  # after training

The model predicts each word's entity type (or `O`), not its B-/I- tag: a run of words of
one type is one entity, written back as `B-` then `I-` tags. Tried on WNUT-17 (same
settings, 6 epochs): predicting BIO tags, the model put `B-` on every capitalised word and
split "Colonel Rajesh Kalia" into separate entities; predicting types lifted dev entity
F1 from 0.17 to 0.23 and test from 0.12 to 0.15. The cost: two entities of one type side by
side merge into one (16 of 1,975 training entities, 5 of 1,079 in test), which the scores,
computed against the gold B-/I- tags, count as errors.

Alignment: each word is split into WordPiece pieces on its own (`data.lowercase` defaults
to false here: capitals carry much of the entity signal). A sentence is `[CLS]` and its
words' pieces; a word's class (its type, or `O`) is the target at its first piece, and
its other pieces are weighted 0, out of the loss and the metrics. A word that makes no piece at all (a
zero-width space, a soft hyphen) is given one `[UNK]` piece, so that every word has a
place and a prediction.

Word shapes: besides its pieces, every piece carries its word's shape (lower, Title, ALL
CAPS, mIxed, number, punctuation, URL, @mention, #hashtag; at the start of the sentence
or not), an id the tagger embeds and adds to the piece's embedding. Subword pieces of a
small cased vocabulary hide capitalisation in which piece was picked; the shape says it
outright, and it is most of what tells a name from a word in noisy text. A word with
capitals also carries, in the same id, how often the training split saw it all lower-case
(never, 1 to 4 times, 5 or more: `case_bucket`; the counts are saved in the run folder as
`lowercase-words.json`, so `eval` and `predict` see the same ids). Test "sentences" of
WNUT-17 are often whole posts, and the capitalised first words of their inner sentences
("The", "In", "Listen") were the commonest false persons; a name never seen lower-case
("Calgary") stays in bucket 0. With it, test entity F1 went from 0.187 (a rerun of the
shapes-only model; 0.175 before) to 0.222 and 0.217 (seeds 0 and 1).

Characters: every piece also carries its word's characters (`word_chars`: a fixed table
of printable ASCII, accent-stripped letters and a class for any other character, between
start and end marks, 20 a word, a longer word's first and last 9), which
`models/chars.py` turns into one vector (a width-3 convolution, a max over the
characters) added to the piece's embedding: suffixes, inner capitals, digits, @ and # of
words the vocabulary cuts into small pieces. On top of the case buckets it lifted test
entity F1 from 0.222 / 0.217 to 0.232 / 0.236 (seeds 0 / 1; seeds 2 and 3: 0.224,
0.227), at a cost in tokens/s; on its own, without the buckets, one seed scored 0.154,
below the shapes-only 0.187. Nearly all of it is `person` (F1 0.31 to 0.35; the other
five types score 0 on test in most runs): WNUT's test entities are new names, and the model types nearly every new
name it finds as a person. Runs are not bit-reproducible and dev F1, which picks the
checkpoint, jumps from one evaluation to the next: reruns of seeds 0 and 1 scored 0.183
and 0.239 (0.223 on average over the six runs).

Truncation never splits a word: a sentence is cut before the first word whose pieces do
not all fit into `data.max_length` (the `[CLS]` piece included). That word and the ones
after it are truncated: counted (logged at start, `truncated_words` in each evaluation),
still written to the predictions file, predicted `O`, so their entities count as missed.

Scores follow conlleval (see `amptrain.metrics.spans`): an entity is found when a predicted
entity has its exact span and type.
"""

import json
import logging
import os
import re
import unicodedata
from collections import Counter

import numpy as np

from amptrain.data import conll
from amptrain.data.batching import round_up
from amptrain.data.vocabulary import CLS, PAD_ID, UNK, WordPiece
from amptrain.metrics import spans
from amptrain.tasks.common import TextTask, batch_signature, sparse_cross_entropy, token_counts

# TensorFlow is imported inside the methods that need it, so that a malformed data
# file is reported (one line, path:line) before TensorFlow's start-up prints anything.

logger = logging.getLogger("amptrain")

# Words of a raw text given to `predict`: a URL, an @mention or #hashtag, a run of letters
# and digits (with inner apostrophes, hyphens or dots: "don't", "e-mail", "U.S"), or any
# other single character. (WNUT's own tokens split "it's" into "it" and "'s".)
WORD = re.compile(r"https?://\S+|[@#]?\w+(?:['’.-]\w+)*|\S")


SHAPES = ("lower", "title", "caps", "mixed", "number", "punctuation", "url", "mention", "hashtag")
# 0: [CLS] and padding; then each shape at the sentence start or not (18 ids), times the 3
# case buckets (`case_bucket`): 55 ids, the table padded to a multiple of 8 (tensor cores;
# `amptrain audit` checks it).
NUM_SHAPES = 56
LOWERCASE_WORDS_FILE = "lowercase-words.json"


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


class TaggedSplit:
    """One split's sentences, aligned: piece ids, first-piece positions and word tag ids."""

    def __init__(self, name, path, sentences, tag_ids, word_pieces, max_length, cls_id, lowercase_counts=None):
        self.name, self.path, self.sentences = name, path, sentences
        self.tag_ids = [np.asarray(ids, np.int32) for ids in tag_ids]
        aligned = [align([word_pieces[w] for w in s.words], max_length, cls_id) for s in sentences]
        self.token_ids = [ids for ids, _, _ in aligned]
        self.first_pieces = [firsts for _, firsts, _ in aligned]
        words = [s.words for s in sentences]
        self.shapes = [piece_shapes(w, ids, firsts, lowercase_counts) for w, (ids, firsts, _) in zip(words, aligned)]
        self.chars = [piece_chars(w, ids, firsts) for w, (ids, firsts, _) in zip(words, aligned)]
        self.truncated_words = int(sum(cut for _, _, cut in aligned))
        self.lengths = np.array([len(ids) for ids in self.token_ids])
        self.words = sum(len(s.words) for s in sentences)


class NerTask(TextTask):
    primary_metric = "entity_f1"
    default_lowercase = False
    predictions_suffix = ".conll"

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        """Reads the splits, learns (or reloads from the run folder) the vocabulary and the
        tag set, and aligns. Bucket lengths come from the first named split the config has."""
        wanted, paths = self._wanted_splits(split_names)
        sentences = {name: conll.read_conll(paths[name], self.config.data.format) for name in wanted}
        self.labels = self._load_or_make_labels(lambda: conll.tag_set(sentences["train"]))
        self._set_classes()
        # Unknown tags are reported before any slow work.
        tag_ids = {name: conll.tag_ids(sentences[name], self.labels, paths[name]) for name in wanted}
        train_texts = [" ".join(s.words) for s in sentences["train"]] if "train" in sentences else None
        self.tokenizer = WordPiece(self._load_or_make_vocabulary(train_texts), lowercase=self.lowercase)
        self.lowercase_counts = self._load_or_make_lowercase_counts(sentences.get("train"))
        present = [name for name in split_names if name in sentences]
        for name in present:
            self.splits[name] = self._encode(name, paths[name], sentences[name], tag_ids[name])
        if present:
            self.boundaries = self._boundaries(self.splits[present[0]].lengths)
            self._log_data(present)

    def _load_or_make_lowercase_counts(self, train_sentences):
        """{word: times seen} of the training split's all lower-case words (with a letter),
        saved in the run folder (else read again from `data.train`)."""
        path = os.path.join(self.run_dir, LOWERCASE_WORDS_FILE)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        if train_sentences is None:
            train_sentences = conll.read_conll(self.config.data.train, self.config.data.format)
        counts = Counter(w for s in train_sentences for w in s.words if w == w.lower() and any(c.isalpha() for c in w))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(counts.items())), f, ensure_ascii=False)
        return dict(counts)

    def _set_classes(self):
        """What the model predicts for a word: its entity type, or `O` (see the module's
        docstring), and the class of each tag of the tag set."""
        self.classes = [conll.OUTSIDE] + [tag[2:] for tag in self.labels if tag.startswith("B-")]
        self.class_of_tag = np.array(
            [self.classes.index(conll.entity_type(tag) or conll.OUTSIDE) for tag in self.labels]
        )

    def _log_data(self, present):
        first = self.splits[present[0]]
        truncated = ", ".join(f"{name} {self.splits[name].truncated_words}" for name in present)
        logger.info(
            f"data: {len(first.sentences)} {first.name} sentences ({first.words} words), {len(self.labels)} tags "
            f"{self.labels}, predicted as a word's type {self.classes}, "
            f"vocabulary {self.tokenizer.size} ({'lowercased' if self.lowercase else 'cased'}), "
            f"words truncated to {self.config.data.max_length} pieces: {truncated}; bucket lengths {self.boundaries}"
        )

    def word_pieces(self, words):
        """Piece ids of each distinct word, tokenized on its own; a word that makes no piece
        (odd characters only) is one [UNK] piece."""
        distinct = sorted(set(words))
        unknown = np.array([self.tokenizer.token_id(UNK)], np.int32)
        encoded = self.tokenizer.encode(distinct) if distinct else []
        return {word: ids if len(ids) else unknown for word, ids in zip(distinct, encoded)}

    def _encode(self, name, path, sentences, tag_ids):
        pieces = self.word_pieces([w for s in sentences for w in s.words])
        cls_id = self.tokenizer.token_id(CLS)
        return TaggedSplit(
            name, path, sentences, tag_ids, pieces, self.config.data.max_length, cls_id, self.lowercase_counts
        )

    def _batch_builder(self, split):
        outside = self.classes.index(conll.OUTSIDE)
        outside_weight = self.config.train.outside_weight

        def build(indices, length):
            batch = len(indices)
            ids = np.full((batch, length), PAD_ID, np.int32)
            shapes = np.zeros((batch, length), np.int32)
            chars = np.zeros((batch, length, CHARS_PER_WORD), np.int32)
            tags = np.zeros((batch, length), np.int32)
            weights = np.zeros((batch, length), np.float32)
            for row, index in enumerate(indices):
                if index >= 0:
                    pieces, firsts = split.token_ids[index], split.first_pieces[index]
                    ids[row, : len(pieces)] = pieces
                    shapes[row, : len(pieces)] = split.shapes[index]
                    chars[row, : len(pieces)] = split.chars[index]
                    # Only a word's first piece carries its tag; truncated words have none.
                    word_classes = self.class_of_tag[split.tag_ids[index][: len(firsts)]]
                    tags[row, firsts] = word_classes
                    weights[row, firsts] = np.where(word_classes == outside, outside_weight, 1.0)
            mask = ids != PAD_ID
            features = {"token_ids": ids, "padding_mask": mask, "shape_ids": shapes, "char_ids": chars}
            return features, {"labels": tags, "weights": weights}, token_counts(mask)

        return build

    @staticmethod
    def signature():
        import tensorflow as tf

        features, targets, counts = batch_signature(target_shape=(None, None))
        extra = {
            "shape_ids": tf.TensorSpec((None, None), tf.int32),
            "char_ids": tf.TensorSpec((None, None, CHARS_PER_WORD), tf.int32),
        }
        return {**features, **extra}, targets, counts

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.models.tagger import build_tagger

        d = self.config.data
        return build_tagger(
            self.tokenizer.size,
            round_up(d.max_length),
            len(self.classes),
            self.config.model,
            dtype,
            num_shapes=NUM_SHAPES,
            num_chars=NUM_CHARS,
        )

    @staticmethod
    def loss_fn(targets, logits):
        """(the weighted sum of the cross-entropies at real words' first pieces, their count):
        the engine divides by the global count, so the loss is a mean over the real words
        of the whole batch, `O` words weighing `train.outside_weight`."""
        import tensorflow as tf

        # float32: the logits are float32 already; cross-entropy's log-sum-exp stays there.
        losses = sparse_cross_entropy(targets["labels"], logits)
        weights = targets["weights"]
        return tf.reduce_sum(losses * weights), tf.reduce_sum(tf.cast(weights > 0, tf.float32))

    # === Evaluation and prediction ===

    def predicted_tags(self, predict, split):
        """Each sentence's predicted tags, one a word; a truncated word is predicted `O`."""
        predicted = [None] * len(split.sentences)
        for indices, logits in self.outputs(predict, split):
            for row, index in enumerate(indices):
                if index >= 0:
                    firsts = split.first_pieces[index]
                    tags = conll.types_to_tags([self.classes[i] for i in logits[row, firsts].argmax(axis=-1)])
                    predicted[index] = tags + [conll.OUTSIDE] * (len(split.sentences[index].words) - len(firsts))
        return predicted

    def evaluate(self, split_name, predict, predictions_path=None):
        split = self.splits[split_name]
        predicted = self.predicted_tags(predict, split)
        gold = [list(s.tags) for s in split.sentences]
        metrics = spans.score(gold, predicted)
        metrics.update(sentences=len(split.sentences), words=split.words, truncated_words=split.truncated_words)
        if predictions_path:
            write_predictions(predictions_path + self.predictions_suffix, split.sentences, predicted)
        return metrics

    def add_split(self, name, path):
        """Reads and aligns another tagged file (for `amptrain eval --data`)."""
        sentences = conll.read_conll(path, self.config.data.format)
        self.splits[name] = self._encode(name, path, sentences, conll.tag_ids(sentences, self.labels, path))
        self.boundaries = self._boundaries(self.splits[name].lengths)

    def predict_texts(self, predict, texts):
        """Each text split into words (`WORD`), tagged; returns one record a text:
        {"text", "tokens", "tags", "entities": [{"type", "text", "start", "end"}]},
        entity offsets in characters of the text (end exclusive)."""
        matches = [list(WORD.finditer(text)) for text in texts]
        tagged = [m for m in matches if m]
        sentences = [conll.Sentence(tuple(w.group() for w in m), (conll.OUTSIDE,) * len(m), 1) for m in tagged]
        predicted = iter([])
        if sentences:
            split = self._encode("input", "input", sentences, [[0] * len(s.words) for s in sentences])
            self.boundaries = self._boundaries(split.lengths)
            predicted = iter(self.predicted_tags(predict, split))
        return [_record(text, m, next(predicted) if m else []) for text, m in zip(texts, matches)]


def _record(text, words, tags):
    entities = [
        {
            "type": kind,
            "text": text[words[start].start() : words[end - 1].end()],
            "start": words[start].start(),
            "end": words[end - 1].end(),
        }
        for kind, start, end in spans.spans(tags)
    ]
    return {"text": text, "tokens": [w.group() for w in words], "tags": tags, "entities": entities}


def write_predictions(path, sentences, predicted):
    """`word<TAB>gold<TAB>predicted` a line, a blank line after each sentence: every word of
    the split, truncated ones included (conlleval reads this file as it is)."""
    with open(path, "w", encoding="utf-8") as f:
        for sentence, tags in zip(sentences, predicted, strict=True):
            for word, gold, tag in zip(sentence.words, sentence.tags, tags, strict=True):
                f.write(f"{word}\t{gold}\t{tag}\n")
            f.write("\n")
