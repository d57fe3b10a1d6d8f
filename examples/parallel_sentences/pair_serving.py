"""The pair task's serving graph: `english<TAB>spanish` strings in, the label and the two
probabilities out, tokenized and cut in the graph exactly as `ParallelSentences.encode`
(`room`) does.

    module = PairModule(task, model)
    module.serve(tf.constant(["In the beginning ...\tEn el principio ..."]))   # {"label", "probabilities"}
"""

import tensorflow as tf

from amptrain.data.vocabulary import CLS, PAD_ID, SEP
from amptrain.serving.modules import ServingModule
from amptrain.tasks.classification.serving import ClassifierModule

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="token_ids")
SEGMENTS_SPEC = tf.TensorSpec([None, None], tf.int32, name="segment_ids")


class PairModule(ServingModule):
    converts_to_onnx = False
    onnx_refusal = "the pair task exports as a SavedModel only"

    def __init__(self, task, model):
        super().__init__(model)
        self.labels = tf.constant(task.labels)
        self._tokenizer = task.tokenizer
        self._cls = task.tokenizer.token_id(CLS)
        self._sep = task.tokenizer.token_id(SEP)
        self._budget = task.config.data.max_length - 3
        self.serve = tf.function(self._serve, input_signature=[TEXT_SPEC])
        self.serve_ids = tf.function(self._serve_ids, input_signature=[IDS_SPEC, SEGMENTS_SPEC])

    def token_ids(self, text):
        """(token ids, segment ids), both (batch, length) int32 padded with 0."""
        sides = tf.strings.split(text, "\t", maxsplit=1).to_tensor("", shape=[None, 2])
        english = tf.cast(self._tokenizer.graph_tokenize(sides[:, 0]), tf.int32)
        spanish = tf.cast(self._tokenizer.graph_tokenize(sides[:, 1]), tf.int32)
        # int32 lengths: oneDNN has no int64 kernels without AVX-512 (and says so on stderr).
        a, b = (tf.cast(side.row_lengths(), tf.int32) for side in (english, spanish))
        half = self._budget // 2
        kept_a = tf.minimum(a, tf.maximum(half, self._budget - b))  # as `room`
        kept_b = tf.minimum(b, self._budget - kept_a)
        english = tf.ragged.boolean_mask(english, tf.ragged.range(a) < kept_a[:, None])
        spanish = tf.ragged.boolean_mask(spanish, tf.ragged.range(b) < kept_b[:, None])
        rows = tf.shape(text)[0]

        def column(value):
            return tf.RaggedTensor.from_tensor(tf.fill([rows, 1], value))

        ids = tf.concat([column(self._cls), english, column(self._sep), spanish, column(self._sep)], axis=1)
        first = tf.ragged.range(kept_a + 2) * 0
        second = tf.ragged.range(kept_b + 1) * 0 + 1
        segments = tf.cast(tf.concat([first, second], axis=1), tf.int32)
        return ids.to_tensor(PAD_ID), segments.to_tensor(0)

    def _serve_ids(self, token_ids, segment_ids):
        features = {"token_ids": token_ids, "padding_mask": token_ids != PAD_ID, "segment_ids": segment_ids}
        logits = tf.cast(self.model(features, training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}

    def _serve(self, text):
        probabilities = self._serve_ids(*self.token_ids(text))["probabilities"]
        label = tf.gather(self.labels, tf.argmax(probabilities, axis=-1, output_type=tf.int32))
        return {"label": label, "probabilities": probabilities}

    # The same records as amptrain's classifier export: a label and its probabilities.
    records = staticmethod(ClassifierModule.records)
