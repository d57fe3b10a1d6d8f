"""The classifier's head on a pretrained encoder: the checkpoint's pooling
(`config.pretrained.Checkpoint.pooling`): the masked mean of the states for a checkpoint
trained so (all-MiniLM-L6-v2), else the pooled [CLS] state (BERT, ALBERT) or the first
piece's state (the families without a pooler: RoBERTa, XLM-R, DistilBERT); then dropout
and float32 logits, a float32 island.

    model = build_pretrained_classifier(checkpoint, num_classes=2, model_config=config.model,
                                        dtype="mixed_bfloat16")
"""

import keras

from amptrain.models.dropout import Dropout
from amptrain.models.islands import float32_island
from amptrain.models.pooling import MaskedMeanPooling
from amptrain.models.pretrained import encode_pretrained


def build_pretrained_classifier(checkpoint, num_classes, model_config, dtype):
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
    outputs = encode_pretrained(
        checkpoint, token_ids, padding_mask, model_config, dtype, pooled=checkpoint.pooling == "cls"
    )
    if checkpoint.pooling == "mean":
        pooled = MaskedMeanPooling(dtype="float32", name="pooling")(outputs["sequence_output"], padding_mask)
    else:
        pooled = outputs["pooled_output"]
    head_dropout = Dropout(model_config.dropout, dtype="float32", name="head_dropout")
    head_dropout = float32_island(head_dropout, "follows the float32 pooling; a cast back to half would only lose bits")
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")
    logits = float32_island(logits, "logits feed a softmax and a cross-entropy, both unsafe in half precision")
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    return keras.Model(inputs, logits(head_dropout(pooled)), name="pretrained_classifier")
