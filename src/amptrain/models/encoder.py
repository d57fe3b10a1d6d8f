"""The shared Transformer encoder: embeddings, N pre-norm blocks, a final norm."""

import keras

from amptrain.models.blocks import PreNormBlock, TokenAndPositionEmbedding, block_arguments
from amptrain.models.dropout import Dropout
from amptrain.models.lean import LayerNormalization


def encode(
    token_ids, padding_mask, vocabulary_size, max_length, model_config, dtype, extra_ids=None, extra_embeddings=()
):
    """Applies the encoder to symbolic inputs; returns (batch, length, hidden) states.

    `extra_ids` = (ids of the same shape as `token_ids`, how many): a second per-piece
    feature (the tagger's word shapes), embedded and added to the piece embeddings.
    `extra_embeddings`: (batch, length, hidden) tensors added to them too (the tagger's
    character-level word vectors)."""
    c = model_config
    x = TokenAndPositionEmbedding(vocabulary_size, max_length, c.hidden_dim, dtype=dtype, name="embedding")(token_ids)
    if extra_ids is not None:
        ids, count = extra_ids
        x = x + keras.layers.Embedding(count, c.hidden_dim, dtype=dtype, name="extra_embedding")(ids)
    for extra in extra_embeddings:
        x = x + extra
    x = Dropout(c.dropout, dtype=dtype, name="embedding_dropout")(x)
    for i in range(c.num_layers):
        block = PreNormBlock(**block_arguments(c), dtype=dtype, name=f"block_{i}")
        x = block(x, attention_mask=padding_mask)
    return LayerNormalization(epsilon=1e-6, dtype=dtype, name="final_norm")(x)
