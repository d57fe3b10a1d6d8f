"""The serving graph of a user's own Keras model (`amptrain.Trainer.export`): the model's
own inputs in, its outputs out, as one `serving_default` signature.

    module = KerasModelModule(task, model)
    tf.saved_model.save(module, path, signatures=module.signatures())
    loaded.signatures["serving_default"](token_ids=ids)    # {"outputs": (batch, ...)} (or the model's dict)

The signature's inputs are the model's, named as the training batches' features are (a
single tensor input is named `inputs`); outputs are float32.
"""

import tensorflow as tf

from amptrain.errors import UserError
from amptrain.serving.modules import SERVING_DEFAULT, ServingModule


class KerasModelModule(ServingModule):
    converts_to_onnx = False
    onnx_refusal = "your own model exports as a SavedModel (amptrain.Trainer.export)"

    def __init__(self, task, model):
        super().__init__(model)
        features = task.signature()[0]
        self._named = isinstance(features, dict)
        specs = features if self._named else {"inputs": features}
        self._names = list(specs)
        signature = [tf.TensorSpec(specs[n].shape, specs[n].dtype, name=n) for n in self._names]
        self.serve = tf.function(self._serve, input_signature=signature)

    def _serve(self, *tensors):
        features = dict(zip(self._names, tensors)) if self._named else tensors[0]
        outputs = self.model(features, training=False)
        cast = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
        return cast if isinstance(cast, dict) else {"outputs": cast}

    def signatures(self):
        return {SERVING_DEFAULT: self.serve.get_concrete_function()}

    def describe(self):
        return {"signatures": {SERVING_DEFAULT: "the model's own inputs"}, "inputs": self._names}

    @staticmethod
    def records(texts, outputs, metadata):
        raise UserError("an export of your own model takes its own inputs, not texts: load it with tf.saved_model.load")
