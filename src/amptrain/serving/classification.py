"""The classifier's serving graph: raw texts in, the label and the class probabilities out.

    module = ClassifierModule(task, model)
    module.serve(tf.constant(["see you at lunch"]))   # {"label": [b"ham"], "probabilities": [[0.98, 0.02]]}
    module.serve_ids(token_ids)                        # {"logits", "probabilities"}: callers that tokenize

Tokenizing is the run's: its WordPiece vocabulary and casing (`WordPiece.graph_tokenize`),
`[CLS]` first (and `[SEP]` last for a pretrained encoder), cut to `data.max_length`
pieces, padded with id 0, which the model masks (as `ClassificationTask.predict_texts`).
Probabilities are in the order of `labels.json`.
"""

import tensorflow as tf

from amptrain.data.vocabulary import CLS, PAD_ID
from amptrain.serving.modules import ServingModule

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="token_ids")


class ClassifierModule(ServingModule):
    def __init__(self, task, model):
        super().__init__(model)
        self.labels = tf.constant(task.labels)
        self._tokenizer = task.tokenizer
        self._cls_id = task.tokenizer.token_id(CLS)
        self._sep_id = task.sep_id  # a pretrained encoder's [SEP], ending every text; else None
        self._max_length = task.config.data.max_length
        self.serve = tf.function(self._serve, input_signature=[TEXT_SPEC])
        self.serve_ids = tf.function(self._serve_ids, input_signature=[IDS_SPEC])

    def token_ids(self, text):
        """(batch, length) int32: [CLS] and the pieces of each text (and [SEP] for a
        pretrained encoder, kept when the text is cut), cut and padded."""
        pieces = tf.cast(self._tokenizer.graph_tokenize(text), tf.int32)
        cls = tf.fill([tf.shape(text)[0], 1], self._cls_id)
        if self._sep_id is None:
            ragged = tf.concat([tf.RaggedTensor.from_tensor(cls), pieces], axis=1)
            return ragged[:, : self._max_length].to_tensor(PAD_ID)
        sep = tf.fill([tf.shape(text)[0], 1], self._sep_id)
        pieces = pieces[:, : self._max_length - 2]
        ragged = tf.concat([tf.RaggedTensor.from_tensor(cls), pieces, tf.RaggedTensor.from_tensor(sep)], axis=1)
        return ragged.to_tensor(PAD_ID)

    def _serve_ids(self, token_ids):
        logits = self.model({"token_ids": token_ids, "padding_mask": token_ids != PAD_ID}, training=False)
        logits = tf.cast(logits, tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}

    def _serve(self, text):
        probabilities = self._serve_ids(self.token_ids(text))["probabilities"]
        label = tf.gather(self.labels, tf.argmax(probabilities, axis=-1, output_type=tf.int32))
        return {"label": label, "probabilities": probabilities}
