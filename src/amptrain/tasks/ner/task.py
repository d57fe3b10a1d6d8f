"""Named-entity tagging: CoNLL `token<TAB>tag` files in, entity-level precision, recall and F1 out.

    task = NerTask(config, run_dir)
    task.prepare()                                   # read, learn the vocabulary and tags, align
    model, policy, reason = task.create_model()
    dataset = task.train_dataset(start_step=0)       # the engine pulls from this
    task.predict_texts(["Empire State Building = ESB"], model, predict)   # after training

The model predicts each word's entity type (or `O`), not its B-/I- tag: a run of words of
one type is one entity, written back as `B-` then `I-` tags. Each word is split into pieces
on its own; its class is the target at its first piece, its other pieces weigh 0. Every
piece also carries its word's shape and case bucket and its word's characters
(`ner_features.py`). Truncation never splits a word: a sentence is cut before the first
word whose pieces do not all fit into `data.max_length`; such words are counted, written
to the predictions file and predicted `O`. Scores follow conlleval (`tasks/ner/spans.py`).
What each of these choices did to WNUT-17's entity F1: docs/architecture.md,
"Named-entity tagging".
"""

import json
import logging
import math
import os
from collections import Counter

import numpy as np

from amptrain.data.batching import round_up
from amptrain.data.vocabulary import NUL_AS_SPACE, PAD_ID
from amptrain.tasks.base import Split
from amptrain.tasks.ner import conll, spans
from amptrain.tasks.ner.features import (
    CHARS_PER_WORD,
    NUM_CHARS,
    NUM_SHAPES,
    WORD,
    align,
    piece_chars,
    piece_shapes,
)
from amptrain.tasks.ner.serving import TaggerModule
from amptrain.tasks.ner.settings import NerTrain
from amptrain.tasks.text import TextTask, batch_signature, token_counts

# TensorFlow is imported inside the methods that need it, so that a malformed data
# file is reported (one line, path:line) before TensorFlow's start-up prints anything.

logger = logging.getLogger("amptrain")


LOWERCASE_WORDS_FILE = "lowercase-words.json"


def tagged_split(name, path, sentences, tag_ids, word_pieces, max_length, cls_id, lowercase_counts=None, sep_id=None):
    """A split of sentences, aligned: per sentence its `token_ids`, `first_pieces` (each kept
    word's first piece), `shapes` and `chars` a piece, and `tag_ids` a word; `truncated`
    counts the words cut off. With `sep_id` (a pretrained encoder's [SEP]) every sentence
    ends with it, its shape and characters 0 as [CLS]'s."""
    room = max_length if sep_id is None else max_length - 1
    aligned = [align([word_pieces[w] for w in s.words], room, cls_id) for s in sentences]
    words = [s.words for s in sentences]
    encoded = {
        "token_ids": [ids for ids, _, _ in aligned],
        "first_pieces": [firsts for _, firsts, _ in aligned],
        "shapes": [piece_shapes(w, ids, firsts, lowercase_counts) for w, (ids, firsts, _) in zip(words, aligned)],
        "chars": [piece_chars(w, ids, firsts) for w, (ids, firsts, _) in zip(words, aligned)],
        "tag_ids": [np.asarray(ids, np.int32) for ids in tag_ids],
    }
    if sep_id is not None:
        encoded["token_ids"] = [np.append(ids, np.int32(sep_id)) for ids in encoded["token_ids"]]
        encoded["shapes"] = [np.append(shapes, np.int32(0)) for shapes in encoded["shapes"]]
        encoded["chars"] = [np.concatenate([chars, np.zeros_like(chars[:1])]) for chars in encoded["chars"]]
    lengths = np.array([len(ids) for ids in encoded["token_ids"]])
    return Split(name, path, sentences, encoded, lengths, truncated=int(sum(cut for _, _, cut in aligned)))


def word_count(split):
    return sum(len(s.words) for s in split.examples)


class NerTask(TextTask):
    primary_metric = "entity_f1"
    default_lowercase = False
    predictions_suffix = ".conll"
    formats = ("auto", "conll")
    pretrained_kind = "encoder"
    serving_module = TaggerModule
    config_sections = {"train": NerTrain}

    @classmethod
    def check_config(cls, config):
        from amptrain.config import require

        super().check_config(config)
        w = config.train.outside_weight
        require(0 < w < math.inf, "train.outside_weight", "a finite number > 0", w)

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        """Reads the splits, learns (or reloads from the run folder) the vocabulary and the
        tag set, and aligns. Bucket lengths come from the first named split the config has."""
        self._check_checkpoint()
        wanted, paths = self._wanted_splits(split_names)
        sentences = {name: conll.read_conll(paths[name], self.config.data.format) for name in wanted}
        self.labels = self._load_or_make_labels(lambda: conll.tag_set(sentences["train"]))
        self._set_classes()
        # Unknown tags are reported before any slow work.
        tag_ids = {name: conll.tag_ids(sentences[name], self.labels, paths[name]) for name in wanted}
        train_texts = [" ".join(s.words) for s in sentences["train"]] if "train" in sentences else None
        self.tokenizer = self._make_tokenizer(train_texts)
        self.lowercase_counts = self._load_or_make_lowercase_counts(sentences.get("train"))
        present = [name for name in split_names if name in sentences]
        if self._add_splits(
            {name: self._encode(name, paths[name], sentences[name], tag_ids[name]) for name in present}
        ):
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
        truncated = ", ".join(f"{name} {self.splits[name].truncated}" for name in present)
        logger.info(
            f"data: {len(first)} {first.name} sentences ({word_count(first)} words), {len(self.labels)} tags "
            f"{self.labels}, predicted as a word's type {self.classes}, "
            f"vocabulary {self.tokenizer.size} ({'lowercased' if self.lowercase else 'cased'}), "
            f"words truncated to {self.config.data.max_length} pieces: {truncated}; bucket lengths {self.boundaries}"
        )

    def word_pieces(self, words):
        """Piece ids of each distinct word, tokenized on its own; a word that makes no piece
        (odd characters only) is one [UNK] piece."""
        distinct = sorted(set(words))
        unknown = np.array([self.tokenizer.unknown_id], np.int32)
        encoded = self.tokenizer.encode_words(distinct) if distinct else []
        return {word: ids if len(ids) else unknown for word, ids in zip(distinct, encoded)}

    def _encode(self, name, path, sentences, tag_ids):
        pieces = self.word_pieces([w for s in sentences for w in s.words])
        cls_id = self.tokenizer.start_id  # [CLS], or the family's start piece (RoBERTa's <s>)
        sep_id = self.tokenizer.end_id if self.checkpoint is not None else None  # as it was trained
        return tagged_split(
            name, path, sentences, tag_ids, pieces, self.config.data.max_length, cls_id, self.lowercase_counts, sep_id
        )

    def batch_builder(self, split):
        outside = self.classes.index(conll.OUTSIDE)
        outside_weight = self.config.train.outside_weight
        e = split.encoded

        def build(indices, length):
            batch = len(indices)
            ids = np.full((batch, length), PAD_ID, np.int32)
            shapes = np.zeros((batch, length), np.int32)
            chars = np.zeros((batch, length, CHARS_PER_WORD), np.int32)
            tags = np.zeros((batch, length), np.int32)
            weights = np.zeros((batch, length), np.float32)
            for row, index in enumerate(indices):
                if index >= 0:
                    pieces, firsts = e["token_ids"][index], e["first_pieces"][index]
                    ids[row, : len(pieces)] = pieces
                    shapes[row, : len(pieces)] = e["shapes"][index]
                    chars[row, : len(pieces)] = e["chars"][index]
                    # Only a word's first piece carries its tag; truncated words have none.
                    word_classes = self.class_of_tag[e["tag_ids"][index][: len(firsts)]]
                    tags[row, firsts] = word_classes
                    weights[row, firsts] = np.where(word_classes == outside, outside_weight, 1.0)
            mask = ids != PAD_ID
            features = {"token_ids": ids, "padding_mask": mask, "shape_ids": shapes, "char_ids": chars}
            return features, {"labels": tags, "weights": weights}, token_counts(mask)

        return build

    def signature(self):
        import tensorflow as tf

        features, targets, counts = batch_signature(target_shape=(None, None))
        extra = {
            "shape_ids": tf.TensorSpec((None, None), tf.int32),
            "char_ids": tf.TensorSpec((None, None, CHARS_PER_WORD), tf.int32),
        }
        return {**features, **extra}, targets, counts

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.tasks.ner.model import build_tagger

        d = self.config.data
        if self.checkpoint is not None:
            from amptrain.tasks.ner.pretrained import build_pretrained_tagger

            return build_pretrained_tagger(
                self.checkpoint, len(self.classes), self.config.model, dtype, NUM_SHAPES, NUM_CHARS
            )
        return build_tagger(
            self.tokenizer.size,
            round_up(d.max_length),
            len(self.classes),
            self.config.model,
            dtype,
            num_shapes=NUM_SHAPES,
            num_chars=NUM_CHARS,
        )

    def loss(self, targets, logits):
        """(the weighted sum of the cross-entropies at real words' first pieces, their count):
        the engine divides by the global count, so the loss is a mean over the real words
        of the whole batch, `O` words weighing `train.outside_weight`."""
        from amptrain.models.losses import weighted_cross_entropy

        return weighted_cross_entropy(targets["labels"], logits, targets["weights"], count_weights=False)

    # === Evaluation and prediction ===

    def predicted_tags(self, predict, split):
        """Each sentence's predicted tags, one a word; a truncated word is predicted `O`."""
        predicted = [None] * len(split)
        for indices, logits in self.outputs(predict, split):
            for row, index in enumerate(indices):
                if index >= 0:
                    firsts = split.encoded["first_pieces"][index]
                    tags = conll.types_to_tags([self.classes[i] for i in logits[row, firsts].argmax(axis=-1)])
                    predicted[index] = tags + [conll.OUTSIDE] * (len(split.examples[index].words) - len(firsts))
        return predicted

    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        split = self.splits[split_name]
        predicted = self.predicted_tags(predict, split)
        gold = [list(s.tags) for s in split.examples]
        metrics = spans.score(gold, predicted)
        metrics.update(sentences=len(split), words=word_count(split), truncated_words=split.truncated)
        if predictions_path:
            write_predictions(predictions_path + self.predictions_suffix, split.examples, predicted)
        return metrics

    def add_split(self, name, path):
        """Reads and aligns another tagged file (for `amptrain eval --data`)."""
        sentences = conll.read_conll(path, self.config.data.format)
        self._add_own_split(self._encode(name, path, sentences, conll.tag_ids(sentences, self.labels, path)))

    def predict_texts(self, texts, model, predict):
        """Each text split into words (`WORD`), tagged; returns one record a text:
        {"text", "tokens", "tags", "entities": [{"type", "text", "start", "end"}]},
        entity offsets in characters of the text (end exclusive)."""
        matches = [list(WORD.finditer(text.translate(NUL_AS_SPACE))) for text in texts]
        tagged = [m for m in matches if m]
        sentences = [conll.Sentence(tuple(w.group() for w in m), (conll.OUTSIDE,) * len(m), 1) for m in tagged]
        predicted = iter([])
        if sentences:
            split = self._encode("input", "input", sentences, [[0] * len(s.words) for s in sentences])
            predicted = iter(self.predicted_tags(predict, self.own_buckets(split)))
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
