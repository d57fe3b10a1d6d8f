"""The layers a family's encoder needs around keras-hub's backbone (`models.pretrained`)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="amptrain")
class SwapIds(keras.layers.Layer):
    """Exchanges ids 0 and `pad_id`: amptrain pads with 0, a checkpoint whose padding piece is
    `pad_id` (RoBERTa's 1) sees its own ids (`families.tokenizers` swapped them the same way)."""

    def __init__(self, pad_id, **kwargs):
        super().__init__(**kwargs)
        self.pad_id = pad_id

    def call(self, token_ids):
        pad = ops.full_like(token_ids, self.pad_id)
        return ops.where(token_ids == 0, pad, ops.where(token_ids == pad, ops.zeros_like(token_ids), token_ids))

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="amptrain")
class FirstState(keras.layers.Layer):
    """The first piece's state, (batch, length, hidden) -> (batch, hidden): the pooling of a
    family without a pooler (RoBERTa's and DistilBERT's classifiers start from it)."""

    def call(self, states):
        return states[:, 0, :]
