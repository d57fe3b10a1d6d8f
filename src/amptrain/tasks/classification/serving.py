"""The classifier's serving graph: raw texts in, the label and the class probabilities out.

    module = ClassifierModule(task, model)
    module.serve(tf.constant(["see you at lunch"]))   # {"label": [b"ham"], "probabilities": [[0.98, 0.02]]}
    module.serve_ids(token_ids)                        # {"logits", "probabilities"}: callers that tokenize

Tokenizing is the run's: its WordPiece vocabulary and casing (`WordPiece.graph_tokenize`),
`[CLS]` first (and `[SEP]` last for a pretrained encoder), cut to `data.max_length`
pieces (keeping the last `data.keep_tail` of a cut text), padded with id 0, which the
model masks (as `ClassificationTask.predict_texts`).
Probabilities are in the order of `labels.json`.
"""

import tensorflow as tf

from amptrain.data.vocabulary import PAD_ID
from amptrain.serving.modules import ServingModule

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="token_ids")


class ClassifierModule(ServingModule):
    def __init__(self, task, model):
        super().__init__(model)
        self.labels = tf.constant(task.labels)
        self._tokenizer = task.tokenizer
        self._cls_id = task.tokenizer.start_id  # [CLS], or its family's start piece (RoBERTa's <s>)
        self._sep_id = task.sep_id  # a pretrained encoder's [SEP], ending every text; else None
        self._max_length = task.config.data.max_length
        self._keep_tail = task.config.data.keep_tail
        self.serve = tf.function(self._serve, input_signature=[TEXT_SPEC])
        self.serve_ids = tf.function(self._serve_ids, input_signature=[IDS_SPEC])

    def token_ids(self, text):
        """(batch, length) int32: [CLS] and the pieces of each text (and [SEP] for a
        pretrained encoder, kept when the text is cut), cut as `tasks.classification.cut`
        cuts (the first pieces, then the last `data.keep_tail`), and padded."""
        pieces = tf.cast(self._tokenizer.graph_tokenize(text), tf.int32)
        room = self._max_length - 1 - int(self._sep_id is not None)  # the pieces [CLS] and [SEP] leave
        if self._keep_tail:
            # A row no longer than `room` is whole in the two parts: its rest is at most keep_tail.
            rest = pieces[:, room - self._keep_tail :]
            pieces = tf.concat([pieces[:, : room - self._keep_tail], rest[:, -self._keep_tail :]], axis=1)
        else:
            pieces = pieces[:, :room]
        rows = tf.shape(text)[0]
        parts = [tf.RaggedTensor.from_tensor(tf.fill([rows, 1], self._cls_id)), pieces]
        if self._sep_id is not None:
            parts.append(tf.RaggedTensor.from_tensor(tf.fill([rows, 1], self._sep_id)))
        return tf.concat(parts, axis=1).to_tensor(PAD_ID)

    def _serve_ids(self, token_ids):
        logits = self.model({"token_ids": token_ids, "padding_mask": token_ids != PAD_ID}, training=False)
        logits = tf.cast(logits, tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}

    def _serve(self, text):
        probabilities = self._serve_ids(self.token_ids(text))["probabilities"]
        label = tf.gather(self.labels, tf.argmax(probabilities, axis=-1, output_type=tf.int32))
        return {"label": label, "probabilities": probabilities}

    @staticmethod
    def records(texts, outputs, metadata):
        """One JSON-ready record a text from the `serving_default` outputs (as `amptrain predict` makes them)."""
        labels = metadata["labels"]
        return [
            {
                "text": text,
                "label": label.decode(),
                "probabilities": {name: round(float(p), 6) for name, p in zip(labels, probabilities)},
            }
            for text, label, probabilities in zip(texts, outputs["label"], outputs["probabilities"])
        ]
