"""The tagger's head on a pretrained encoder: each piece's encoder state, concatenated with
its word's shape embedding and character-level word vector (the uncased encoder cannot see
case; the shape can), then dropout and float32 logits. The word features join at the
output, not the input: added to the input embeddings, untrained vectors would shift what
every pretrained layer sees.

    model = build_pretrained_tagger(checkpoint, num_tags=7, ..., num_shapes=56, num_chars=104)
"""

import keras

from amptrain.models.dropout import Dropout
from amptrain.models.islands import float32_island
from amptrain.models.pretrained import encode_pretrained
from amptrain.tasks.ner.chars import CharWordEncoder

FEATURE_DIM = 64  # the word-shape embedding and character vector widths


def build_pretrained_tagger(checkpoint, num_tags, model_config, dtype, num_shapes, num_chars):
    inputs = {
        "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input(shape=(None,), dtype="bool", name="padding_mask"),
        "shape_ids": keras.Input(shape=(None,), dtype="int32", name="shape_ids"),
        "char_ids": keras.Input(shape=(None, None), dtype="int32", name="char_ids"),
    }
    states = encode_pretrained(checkpoint, inputs["token_ids"], inputs["padding_mask"], model_config, dtype)[
        "sequence_output"
    ]
    shapes = keras.layers.Embedding(num_shapes, FEATURE_DIM, dtype=dtype, name="shape_embedding")(inputs["shape_ids"])
    chars = CharWordEncoder(num_chars, FEATURE_DIM, dtype=dtype, name="char_encoder")(inputs["char_ids"])
    features = keras.layers.Concatenate(dtype=dtype, name="word_features")([states, shapes, chars])
    features = Dropout(model_config.dropout, dtype=dtype, name="head_dropout")(features)
    logits = keras.layers.Dense(num_tags, dtype="float32", name="logits")
    logits = float32_island(
        logits, "per-token logits feed a softmax and a cross-entropy, both unsafe in half precision"
    )
    return keras.Model(inputs, logits(features), name="pretrained_tagger")
