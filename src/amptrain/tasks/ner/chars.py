"""A character-level word encoder: each piece's word, spelled out, as one vector.

    encoder = CharWordEncoder(num_chars=104, hidden_dim=128, dtype="mixed_bfloat16")
    vectors = encoder(char_ids)  # (batch, length, chars) int -> (batch, length, hidden)

Characters are embedded, a width-3 convolution (written as a dense layer over each
character and its two neighbours) finds character trigrams (a capital after a space, a
suffix, an @ or a digit), and a max over the word's characters keeps the strongest of
each filter; a dense layer projects that to the encoder's width. Id 0 pads: padded
characters take no part in the max, and a piece with no characters at all ([CLS],
padding) gets the projection's bias only.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="amptrain")
class CharWordEncoder(keras.layers.Layer):
    def __init__(self, num_chars, hidden_dim, char_dim=32, filters=128, **kwargs):
        super().__init__(**kwargs)
        self.num_chars = num_chars
        self.hidden_dim = hidden_dim
        self.char_dim = char_dim
        self.filters = filters
        policy = self.dtype_policy
        # === Layers ===
        self.embedding = keras.layers.Embedding(num_chars, char_dim, dtype=policy, name="char_embedding")
        self.convolution = keras.layers.Dense(filters, activation="relu", dtype=policy, name="char_convolution")
        self.projection = keras.layers.Dense(hidden_dim, dtype=policy, name="char_projection")

    def build(self, input_shape):
        self.embedding.build(input_shape)
        self.convolution.build(tuple(input_shape) + (3 * self.char_dim,))
        self.projection.build(tuple(input_shape[:-1]) + (self.filters,))

    def call(self, char_ids):
        x = self.embedding(char_ids)  # (batch, length, chars, char_dim)
        # Each character beside its left and right neighbours (zeros beyond the ends).
        left = ops.pad(x[:, :, :-1], ((0, 0), (0, 0), (1, 0), (0, 0)))
        right = ops.pad(x[:, :, 1:], ((0, 0), (0, 0), (0, 1), (0, 0)))
        features = self.convolution(ops.concatenate([left, x, right], axis=-1))  # (batch, length, chars, filters)
        # relu's outputs are >= 0, so zeroing the padded characters keeps them out of the max.
        real = ops.cast(char_ids != 0, features.dtype)[..., None]
        pooled = ops.max(features * real, axis=2)  # (batch, length, filters)
        return self.projection(pooled)  # (batch, length, hidden)

    def get_config(self):
        return {
            **super().get_config(),
            "num_chars": self.num_chars,
            "hidden_dim": self.hidden_dim,
            "char_dim": self.char_dim,
            "filters": self.filters,
        }
