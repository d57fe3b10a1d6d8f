"""A Transformer encoder token tagger: the shared encoder and a float32 tag head per piece.

    model = build_tagger(vocabulary_size=4000, max_length=256, num_tags=13,
                         model_config=config.model, dtype="mixed_bfloat16")
    logits = model({"token_ids": ids, "padding_mask": mask, "shape_ids": shapes, "char_ids": chars})
    # (batch, length, tags) float32

`num_shapes` > 0 adds a `shape_ids` input (each piece's word shape, see tasks/ner/task.py),
embedded and added to the piece embeddings. `num_chars` > 0 adds a `char_ids` input
(batch, length, characters a word): each piece's word spelled out, encoded into one vector
by `tasks/ner/chars.py` and added to the piece embeddings too.
"""

import keras

from amptrain.models.dropout import Dropout
from amptrain.models.encoder import encode
from amptrain.models.islands import float32_island
from amptrain.tasks.ner.chars import CharWordEncoder


def build_tagger(vocabulary_size, max_length, num_tags, model_config, dtype, num_shapes=0, num_chars=0):
    # === Inputs ===
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    extra = None
    if num_shapes:
        inputs["shape_ids"] = keras.Input(shape=(None,), dtype="int32", name="shape_ids")
        extra = (inputs["shape_ids"], num_shapes)
    embeddings = []
    if num_chars:
        inputs["char_ids"] = keras.Input(shape=(None, None), dtype="int32", name="char_ids")
        chars = CharWordEncoder(num_chars, model_config.hidden_dim, dtype=dtype, name="char_encoder")
        embeddings.append(chars(inputs["char_ids"]))
    # === Functional Model ===
    states = encode(
        token_ids,
        padding_mask,
        vocabulary_size,
        max_length,
        model_config,
        dtype,
        extra_ids=extra,
        extra_embeddings=embeddings,
    )
    states = Dropout(model_config.dropout, dtype=dtype, name="head_dropout")(states)
    logits = keras.layers.Dense(num_tags, dtype="float32", name="logits")
    logits = float32_island(
        logits, "per-token logits feed a softmax and a cross-entropy, both unsafe in half precision"
    )
    return keras.Model(inputs, logits(states), name="tagger")
