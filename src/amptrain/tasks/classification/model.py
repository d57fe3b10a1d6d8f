"""A Transformer encoder text classifier.

model = build_classifier(vocabulary_size=8000, max_length=128, num_classes=2,
                         model_config=config.model, dtype="mixed_bfloat16")
logits = model({"token_ids": ids, "padding_mask": mask})  # (batch, classes) float32
"""

import keras

from amptrain.models.dropout import Dropout
from amptrain.models.encoder import encode
from amptrain.models.islands import float32_island
from amptrain.models.pooling import MaskedMeanPooling


def build_classifier(vocabulary_size, max_length, num_classes, model_config, dtype):
    # === Inputs ===
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
    # === Functional Model ===
    states = encode(token_ids, padding_mask, vocabulary_size, max_length, model_config, dtype)
    pooled = MaskedMeanPooling(dtype="float32", name="pooling")(states, padding_mask)
    head_dropout = Dropout(model_config.dropout, dtype="float32", name="head_dropout")
    head_dropout = float32_island(head_dropout, "follows the float32 pooling; a cast back to half would only lose bits")
    pooled = head_dropout(pooled)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")
    logits = float32_island(logits, "logits feed a softmax and a cross-entropy, both unsafe in half precision")(pooled)
    return keras.Model({"token_ids": token_ids, "padding_mask": padding_mask}, logits, name="classifier")
