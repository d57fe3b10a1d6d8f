"""The translator's serving graph: raw texts in, the beam-search translation out.

    module = TranslatorModule(task, model)
    module.serve(tf.constant(["In the beginning was the Word"]))   # {"translation": [b"En el principio ..."]}
    module.serve_ids(source_ids)   # {"target_ids": (batch, decode length)}: pieces, the end piece, then 0s

As `TranslationTask.predict_texts`: the source pieces (the run's source vocabulary and
casing) cut to `data.max_length`, padded to a multiple of 16 (at most the model's
length), an empty source given one [UNK] piece; the run's search (`tasks/translation/decoding.py`,
`decode.beam_size` and `decode.length_penalty` of the run or of `--set` at export time);
the pieces up to the end piece joined as `detokenize.detokenize` joins them (per-piece
tables of its join rules, made at export time). A blank text (only whitespace, as
`str.strip` sees it) translates to "".
"""

import tensorflow as tf

from amptrain.data.batching import round_up
from amptrain.data.vocabulary import PAD_ID, UNK, nul_as_space
from amptrain.serving import unicode_classes as classes
from amptrain.serving.modules import ServingModule
from amptrain.tasks.translation import detokenize as rules

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
PAD_MULTIPLE = 16  # `TranslationTask.translate_ids` pads sources to multiples of 16


class TranslatorModule(ServingModule):
    converts_to_onnx = False
    onnx_refusal = "a translation run exports as a SavedModel only (its beam search does not convert to ONNX)"

    def __init__(self, task, model):
        super().__init__(model)
        self._tokenizer = task.source_tokenizer
        self._unk_id = task.source_tokenizer.token_id(UNK)
        self._end_id = task.end_id
        self._max_length = task.config.data.max_length
        self._top = round_up(task.config.data.max_length)
        self._search = task._search(model, task.config.decode.beam_size)  # `predict`'s own search, same settings
        self._blank = classes.character_class(r"\s") + "*"
        self.join_tables = join_tables(task.target_tokenizer.vocabulary)
        self.serve = tf.function(self._serve, input_signature=[TEXT_SPEC])
        self.serve_ids = tf.function(self._serve_ids, input_signature=[IDS_SPEC])

    def describe(self):
        return {
            **super().describe(),
            "decode": {
                "beam_size": self._search.beam_size,
                "length_penalty": self._search.length_penalty,
                "max_length": self._search.max_length,
            },
        }

    def _serve_ids(self, source_ids):
        # An empty source is one [UNK] piece, as in `translate_ids`.
        first = tf.where(source_ids[:, :1] == PAD_ID, self._unk_id, source_ids[:, :1])
        source_ids = tf.concat([first, source_ids[:, 1:]], axis=1)
        return {"target_ids": self._search.ops(source_ids, source_ids != PAD_ID)}

    def source_ids(self, text):
        """(batch, length): each text's pieces, cut, padded to a multiple of 16 (at most
        the model's length)."""
        pieces = tf.cast(self._tokenizer.graph_tokenize(text), tf.int32)[:, : self._max_length]
        longest = tf.maximum(tf.reduce_max(tf.cast(pieces.row_lengths(), tf.int32)), 1)
        length = tf.minimum((longest + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE, self._top)
        dense = pieces.to_tensor(PAD_ID)
        return tf.pad(dense, [[0, 0], [0, length - tf.shape(dense)[1]]])

    def detokenize(self, target_ids):
        return detokenize_ids(target_ids, self.join_tables, self._end_id)

    def _serve(self, text):
        text = nul_as_space(text)
        target_ids = self._serve_ids(self.source_ids(text))["target_ids"]
        blank = tf.strings.regex_full_match(text, self._blank)
        return {"translation": tf.where(blank, "", self.detokenize(target_ids))}

    @staticmethod
    def records(texts, outputs, metadata):
        """One JSON-ready record a text from the `serving_default` outputs (as `amptrain predict` makes them)."""
        return [{"text": text, "translation": t.decode()} for text, t in zip(texts, outputs["translation"])]


def join_tables(vocabulary):
    """Per target piece id, `detokenize.detokenize`'s rules as constants: its text as
    written ("text"), whether it is a `##` piece ("suffix"), whether it joins the word
    before: closing marks, apostrophes, hyphens ("before"), and whether the next piece
    joins it: opening marks, apostrophes, hyphens ("after")."""
    suffix = [p.startswith("##") for p in vocabulary]
    before = rules.JOIN_BEFORE | rules.JOIN_BOTH
    after = rules.JOIN_AFTER | rules.JOIN_BOTH
    return {
        "text": tf.constant([p[2:] if s else p for p, s in zip(vocabulary, suffix)]),
        "suffix": tf.constant(suffix),
        "before": tf.constant([p in before for p in vocabulary]),
        "after": tf.constant([p in after for p in vocabulary]),
    }


def detokenize_ids(target_ids, tables, end_id):
    """(batch,) strings: the pieces of each row before its first `end_id` (0s left out),
    joined as `detokenize.detokenize` joins them."""
    before_end = tf.cumsum(tf.cast(target_ids == end_id, tf.int32), axis=1) == 0
    pieces = tf.ragged.boolean_mask(target_ids, before_end & (target_ids != PAD_ID))
    ids, rows = pieces.flat_values, pieces.value_rowids()
    suffix = tf.gather(tables["suffix"], ids)
    # A whole piece joins when it is its row's first whole piece, or joins the word
    # before, or the whole piece before it lets the next one join.
    whole, whole_rows = tf.boolean_mask(ids, ~suffix), tf.boolean_mask(rows, ~suffix)
    first = tf.concat([[True], whole_rows[1:] != whole_rows[:-1]], axis=0)[: tf.size(whole)]
    previous_after = tf.roll(tf.gather(tables["after"], whole), 1, axis=0)
    joins = first | tf.gather(tables["before"], whole) | previous_after
    # 0 at `##` pieces (they always join), 1 at whole pieces that take a space, 2 at those that join.
    spacing = tf.scatter_nd(tf.where(~suffix), 1 + tf.cast(joins, tf.int32), tf.shape(ids, out_type=tf.int64))
    space = tf.where(spacing == 1, " ", "")
    return tf.strings.reduce_join(pieces.with_flat_values(space + tf.gather(tables["text"], ids)), axis=1)
