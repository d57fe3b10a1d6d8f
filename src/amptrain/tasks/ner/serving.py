"""The tagger's serving graph: raw texts in; the words, a tag a word and the entity spans out.

    module = TaggerModule(task, model)
    module.serve(tf.constant(["Empire State Building = ESB"]))
    # words, word_starts, word_ends, tags, num_words; entity_types, entity_texts,
    # entity_starts, entity_ends, num_entities: padded to the batch's most (FILL_TEXT, FILL_OFFSET)
    module.serve_ids(token_ids, shape_ids, char_ids)   # {"logits", "probabilities"} a piece

Everything `NerTask.predict_texts` does in Python is done here in the graph: the words
(`features.WORD` as an RE2 pattern with Python's own `\\w` and `\\S`), each word's pieces on its
own (a word of no piece is one [UNK]), whole words kept while [CLS] and their pieces fit
`data.max_length`, each piece's word shape, case bucket and characters (`ner_features`,
with Python's character classes from `unicode_tables`), the tag of each word from its first
piece, BIO tags and the spans of runs of one type. Offsets are in characters (code points)
of the text, end exclusive, as `predict` gives them. A signature cannot return ragged
tensors, so each output is padded: texts with `FILL_TEXT` (""), offsets with `FILL_OFFSET`
(-1); `num_words` and `num_entities` say how many of a row are real.
"""

import functools

import tensorflow as tf
import tensorflow_text as tf_text

from amptrain.data.vocabulary import PAD_ID, nul_as_space
from amptrain.serving import unicode_classes as classes
from amptrain.serving.modules import ServingModule
from amptrain.tasks.ner import character_table as tables
from amptrain.tasks.ner import conll
from amptrain.tasks.ner.features import CHARS_PER_WORD, SHAPES, WORD

FILL_TEXT, FILL_OFFSET = "", -1
TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPECS = [
    tf.TensorSpec([None, None], tf.int32, name="token_ids"),
    tf.TensorSpec([None, None], tf.int32, name="shape_ids"),
    tf.TensorSpec([None, None, CHARS_PER_WORD], tf.int32, name="char_ids"),
]
SHAPE = {name: i + 1 for i, name in enumerate(SHAPES)}  # `word_shape`'s ids, sentence start aside


@functools.cache
def word_pattern():
    """`features.WORD` for RE2: its `\\w` and `\\S` replaced by Python's own classes."""
    pattern = WORD.pattern.replace(r"\S", classes.negated_class(r"\s")).replace(r"\w", classes.character_class(r"\w"))
    assert "\\" not in pattern.replace("\\x{", ""), "features.WORD has an escape this translation does not know"
    return pattern


class TaggerModule(ServingModule):
    padded_by = {  # the outputs padded to the batch's most words and entities
        "num_words": ("words", "word_starts", "word_ends", "tags"),
        "num_entities": ("entity_types", "entity_texts", "entity_starts", "entity_ends"),
    }

    def __init__(self, task, model):
        super().__init__(model)
        self._tokenizer = task.tokenizer
        # [CLS] and [UNK], or their family's (RoBERTa's <s> and <unk>: models/families/).
        self._cls_id, self._unk_id = task.tokenizer.start_id, task.tokenizer.unknown_id
        # A pretrained encoder's [SEP] ends every sentence (as `tasks.ner.tagged_split`): one piece less for words.
        self._sep_id = task.tokenizer.end_id if task.checkpoint is not None else None
        self._max_length = task.config.data.max_length
        self.classes = tf.constant(task.classes)
        self._outside = task.classes.index(conll.OUTSIDE)
        starts, values = tables.character_table()
        self.table_starts, self.table_values = tf.constant(starts, tf.int32), tf.constant(values, tf.int32)
        keys, lowered = classes.lowercase_map()
        self.lowercase = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.int32), tf.constant(lowered)), ""
        )
        counts = task.lowercase_counts or {"": 0}
        self.lowercase_counts = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(list(counts)), tf.constant(list(counts.values()), tf.int64)
            ),
            0,
        )
        self.serve = tf.function(self._serve, input_signature=[TEXT_SPEC])
        self.serve_ids = tf.function(self._serve_ids, input_signature=IDS_SPECS)

    def describe(self):
        return {
            **super().describe(),
            "classes": [c.decode() for c in self.classes.numpy()],
            "fill": {"text": FILL_TEXT, "offset": FILL_OFFSET},
        }

    # === Words ===

    def _properties(self, code_points):
        """Each code point's `character_table` value."""
        index = tf.searchsorted(self.table_starts, code_points.flat_values, side="right") - 1
        return code_points.with_flat_values(tf.gather(self.table_values, index))

    def shapes(self, words, properties, sentence_start):
        """`ner_features.word_shape` of each word (flat), its tests applied in reverse order."""
        alpha = _has(properties, tables.ALPHA)
        letters = _count(alpha)
        upper = _count(_has(properties, tables.ALPHA | tables.UPPER))
        lower = _count(_has(properties, tables.ALPHA | tables.LOWER))
        first_letter = _column(tf.ragged.boolean_mask(properties, alpha), 0)
        first_upper = tf.bitwise.bitwise_and(first_letter, tables.UPPER) != 0
        first_lower = tf.cast(tf.bitwise.bitwise_and(first_letter, tables.LOWER) != 0, tf.int32)
        second_alnum = tf.bitwise.bitwise_and(_column(properties, 1), tables.ALNUM) != 0
        marked = tf.strings.regex_full_match(words, "[@#].+") & second_alnum
        digit = _count(_has(properties, tables.DIGIT)) > 0
        shape = tf.where(digit, SHAPE["number"], SHAPE["punctuation"])
        shape = tf.where(letters > 0, tf.where(upper > 0, SHAPE["mixed"], SHAPE["lower"]), shape)
        shape = tf.where((letters > 0) & first_upper & (lower - first_lower == letters - 1), SHAPE["title"], shape)
        shape = tf.where(
            (letters > 0) & (upper == letters), tf.where(letters > 1, SHAPE["caps"], SHAPE["title"]), shape
        )
        at = tf.strings.substr(words, 0, 1) == "@"
        shape = tf.where(marked, tf.where(at, SHAPE["mention"], SHAPE["hashtag"]), shape)
        shape = tf.where(tf.strings.regex_full_match(words, "(?s)(http:|https:|www\\.).*"), SHAPE["url"], shape)
        return shape + tf.where(sentence_start, len(SHAPES), 0)

    def case_buckets(self, words, code_points):
        """`ner_features.case_bucket` of each word (flat): 0, 1 or 2, from its `str.lower()`."""
        mapped = self.lowercase.lookup(code_points.flat_values)
        same = tf.strings.unicode_encode(code_points.flat_values[:, None], "UTF-8")  # each character as it is
        lowered = tf.strings.reduce_join(code_points.with_flat_values(tf.where(mapped == "", same, mapped)), axis=1)
        count = self.lowercase_counts.lookup(lowered)
        bucket = tf.where(count == 0, 0, tf.where(count < 5, 1, 2))
        return tf.where(lowered == words, 0, bucket)

    def characters(self, properties):
        """`ner_features.word_chars` of each word (flat): (words, CHARS_PER_WORD), the start
        mark, the characters (a long word's first keep // 2 and last keep - keep // 2), the
        end mark, zeros."""
        keep = CHARS_PER_WORD - 2
        ids = properties.with_flat_values(tf.bitwise.bitwise_and(properties.flat_values, tables.CHAR_ID_MASK))
        length = tf.cast(ids.row_lengths(), tf.int32)[:, None]
        full = tf.pad(ids.to_tensor(0), [[0, 0], [0, 1]])  # at least one column
        position = tf.range(keep)[None]
        source = tf.where((length > keep) & (position >= keep // 2), length - keep + position, position)
        kept = tf.gather(full, tf.minimum(source, tf.shape(full)[1] - 1), batch_dims=1)
        kept = tf.where(position < tf.minimum(length, keep), kept, 0)
        chars = tf.concat([tf.ones_like(length), kept, tf.zeros_like(length)], axis=1)
        return tf.where(tf.range(CHARS_PER_WORD)[None] == tf.minimum(length, keep) + 1, 2, chars)

    # === Pieces and tags ===

    def _serve_ids(self, token_ids, shape_ids, char_ids):
        features = {
            "token_ids": token_ids,
            "padding_mask": token_ids != PAD_ID,
            "shape_ids": shape_ids,
            "char_ids": char_ids,
        }
        logits = tf.cast(self.model(features, training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}

    def features(self, words):
        """The model's inputs for ragged (batch, words) strings, with which words fit and
        where each word's first piece is: (features, kept, firsts), the last two flat (words)."""
        flat = words.flat_values
        code_points = tf.strings.unicode_decode(flat, "UTF-8")
        properties = self._properties(code_points)
        sentence_start = tf.ragged.range(words.row_lengths()).flat_values == 0
        shapes = self.shapes(flat, properties, sentence_start)
        shapes += 2 * len(SHAPES) * self.case_buckets(flat, code_points)
        chars = self.characters(properties)
        pieces = self.word_pieces(flat)
        counts = tf.cast(pieces.row_lengths(), tf.int32)
        # Each word's end in its sentence's pieces, [CLS] first: a running sum within each row.
        running = tf.cumsum(counts)
        before = tf.gather(tf.concat([[0], running], 0), tf.gather(words.row_starts(), words.value_rowids()))
        ends = running - tf.cast(before, tf.int32) + 1
        room = self._max_length if self._sep_id is None else self._max_length - 1
        kept = ends <= room  # whole words, while they fit: a prefix of each sentence
        per_sentence = tf.math.unsorted_segment_sum(
            tf.cast(counts, tf.int64) * tf.cast(kept, tf.int64), words.value_rowids(), words.nrows()
        )
        kept_counts = tf.boolean_mask(counts, kept)
        batch = tf.cast(words.nrows(), tf.int32)

        def by_sentence(first, per_word):
            per_piece = tf.repeat(tf.boolean_mask(per_word, kept), kept_counts, axis=0)
            return _after(first, tf.RaggedTensor.from_row_lengths(per_piece, per_sentence))

        ids = tf.RaggedTensor.from_row_lengths(tf.ragged.boolean_mask(pieces, kept).flat_values, per_sentence)
        features = {
            "token_ids": _after(tf.fill([batch, 1], self._cls_id), ids),
            "shape_ids": by_sentence(tf.zeros([batch, 1], tf.int32), shapes),
            "char_ids": by_sentence(tf.zeros([batch, 1, CHARS_PER_WORD], tf.int32), chars),
        }
        if self._sep_id is not None:  # [SEP] last, its shape and characters 0 as [CLS]'s
            features["token_ids"] = _before(features["token_ids"], tf.fill([batch, 1], self._sep_id))
            features["shape_ids"] = _before(features["shape_ids"], tf.zeros([batch, 1], tf.int32))
            features["char_ids"] = _before(features["char_ids"], tf.zeros([batch, 1, CHARS_PER_WORD], tf.int32))
        features = {name: ragged.to_tensor(PAD_ID) for name, ragged in features.items()}
        return features, kept, ends - counts

    def word_pieces(self, words):
        """Each word's pieces, tokenized on its own (ragged); a word of none is one [UNK]."""
        pieces = tf.cast(self._tokenizer.graph_tokenize_words(words), tf.int32)
        empty = pieces.row_lengths() == 0
        unknown = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(tf.cast(empty, tf.int32))], self._unk_id), tf.cast(empty, tf.int64)
        )
        return tf.concat([pieces, unknown], axis=1)

    def word_classes(self, logits, words, kept, firsts):
        """Each word's class (flat): the argmax of the logits at its first piece; `O` when cut off."""
        rows = tf.cast(words.value_rowids(), tf.int32)
        at_first = tf.gather_nd(logits, tf.stack([rows, tf.where(kept, firsts, 0)], axis=1))
        return tf.where(kept, tf.argmax(at_first, axis=-1, output_type=tf.int32), self._outside)

    def _serve(self, text):
        words, starts, ends = split_words(nul_as_space(text))
        features, kept, firsts = self.features(words)
        logits = self._serve_ids(features["token_ids"], features["shape_ids"], features["char_ids"])["logits"]
        classes = self.word_classes(logits, words, kept, firsts)
        # `types_to_tags` and `spans.spans`: a run of words of one type is one entity.
        position = tf.ragged.range(words.row_lengths()).flat_values
        last = tf.gather(words.row_lengths(), words.value_rowids()) - 1
        previous = tf.where(position == 0, -1, tf.roll(classes, 1, axis=0))
        following = tf.where(position == last, -1, tf.roll(classes, -1, axis=0))
        inside = classes != self._outside
        kinds = tf.gather(self.classes, classes)
        tags = tf.where(inside, tf.where(previous == classes, "I-", "B-") + kinds, conll.OUTSIDE)
        begins, finishes = inside & (previous != classes), inside & (following != classes)
        rows = words.value_rowids()
        entity_starts = tf.RaggedTensor.from_value_rowids(
            tf.boolean_mask(starts.flat_values, begins), tf.boolean_mask(rows, begins), words.nrows()
        )
        entity_ends = tf.boolean_mask(ends.flat_values, finishes)
        entity_texts = tf.strings.substr(
            tf.gather(text, tf.boolean_mask(rows, begins)),
            entity_starts.flat_values,
            entity_ends - entity_starts.flat_values,
            unit="UTF8_CHAR",
        )
        return {
            "words": words.to_tensor(FILL_TEXT),
            "word_starts": starts.to_tensor(FILL_OFFSET),
            "word_ends": ends.to_tensor(FILL_OFFSET),
            "tags": words.with_flat_values(tags).to_tensor(FILL_TEXT),
            "num_words": tf.cast(words.row_lengths(), tf.int32),
            "entity_types": entity_starts.with_flat_values(tf.boolean_mask(kinds, begins)).to_tensor(FILL_TEXT),
            "entity_texts": entity_starts.with_flat_values(entity_texts).to_tensor(FILL_TEXT),
            "entity_starts": entity_starts.to_tensor(FILL_OFFSET),
            "entity_ends": entity_starts.with_flat_values(entity_ends).to_tensor(FILL_OFFSET),
            "num_entities": tf.cast(entity_starts.row_lengths(), tf.int32),
        }

    @staticmethod
    def records(texts, outputs, metadata):
        """One JSON-ready record a text from the `serving_default` outputs (as `amptrain predict` makes them)."""
        records = []
        for i, text in enumerate(texts):
            words, entities = outputs["num_words"][i], outputs["num_entities"][i]
            records.append(
                {
                    "text": text,
                    "tokens": [w.decode() for w in outputs["words"][i][:words]],
                    "tags": [t.decode() for t in outputs["tags"][i][:words]],
                    "entities": [
                        {
                            "type": outputs["entity_types"][i][j].decode(),
                            "text": outputs["entity_texts"][i][j].decode(),
                            "start": int(outputs["entity_starts"][i][j]),
                            "end": int(outputs["entity_ends"][i][j]),
                        }
                        for j in range(entities)
                    ],
                }
            )
        return records


def split_words(text):
    """`features.WORD`'s matches in each text: (words, character starts, character ends), each
    ragged (batch, words), offsets in code points, ends exclusive (as `re.finditer` gives)."""
    word = word_pattern()
    space_run = classes.character_class(r"\s") + "+"
    words, begins, ends = tf_text.regex_split_with_offsets(text, f"{word}|{space_run}", word)
    _, char_bytes = tf.strings.unicode_decode_with_offsets(text, "UTF-8")
    # A byte offset -> the index of the character starting there (the text's end: its length).
    char_bytes = char_bytes.to_tensor(tf.int64.max)
    return (
        words,
        words.with_flat_values(_to_chars(char_bytes, begins)),
        words.with_flat_values(_to_chars(char_bytes, ends)),
    )


def _to_chars(char_bytes, byte_offsets):
    """Ragged byte offsets -> character offsets, row by row (`char_bytes`: each text's
    characters' byte starts, padded with the largest int64)."""
    dense = byte_offsets.to_tensor(0)
    chars = tf.searchsorted(char_bytes, dense, side="left")
    return tf.cast(tf.RaggedTensor.from_tensor(chars, lengths=byte_offsets.row_lengths()).flat_values, tf.int32)


def _has(properties, bits):
    """Ragged bool: whether each value has all of `bits`."""
    return properties.with_flat_values(tf.bitwise.bitwise_and(properties.flat_values, bits) == bits)


def _count(flags):
    """How many of each row's (ragged bool) are true."""
    return tf.math.unsorted_segment_sum(tf.cast(flags.flat_values, tf.int32), flags.value_rowids(), flags.nrows())


def _column(ragged, index):
    """Each row's value at `index`, 0 where the row is shorter."""
    return tf.pad(ragged.to_tensor(0), [[0, 0], [0, index + 1]])[:, index]


def _before(ragged, last):
    """Each row of `ragged`, then `last` (batch, 1, …)."""
    return tf.concat([ragged, tf.RaggedTensor.from_tensor(last)], axis=1)


def _after(first, ragged):
    """`first` (batch, 1, …) then each row of `ragged`."""
    return tf.concat([tf.RaggedTensor.from_tensor(first), ragged], axis=1)
