"""The pair classifier: amptrain's encoder over `[CLS] english [SEP] spanish [SEP]`, a
segment embedding added to the piece embeddings, mean-pooled, two logits.

    model = build_pair_classifier(vocabulary_size=4000, max_length=96, model_config=config.model,
                                  dtype="mixed_bfloat16")
    logits = model({"token_ids": ids, "padding_mask": mask, "segment_ids": segments})  # (batch, 2)
"""

import keras

from amptrain.data.batching import round_up
from amptrain.models.encoder import encode
from amptrain.models.islands import float32_island
from amptrain.models.pooling import MaskedMeanPooling


def build_pair_classifier(vocabulary_size, max_length, model_config, dtype):
    # === Inputs ===
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
    segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
    # === Functional Model ===
    # extra_ids: the segment of each piece (0 english, 1 spanish) embedded and added.
    states = encode(
        token_ids, padding_mask, vocabulary_size, round_up(max_length), model_config, dtype, extra_ids=(segment_ids, 2)
    )
    pooled = MaskedMeanPooling(dtype="float32", name="pooling")(states, padding_mask)
    logits = keras.layers.Dense(2, dtype="float32", name="logits")
    logits = float32_island(logits, "logits feed a softmax and a cross-entropy, both unsafe in half precision")(pooled)
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask, "segment_ids": segment_ids}
    return keras.Model(inputs, logits, name="pair_classifier")
