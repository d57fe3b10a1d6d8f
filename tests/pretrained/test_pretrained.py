"""Pretrained encoders (`model.pretrained`): amptrain's tokenizer and keras-hub's encoder
against the reference implementation, the folder checks, and the fine-tuning recipe.

The reference values were made once with Hugging Face `transformers` on PyTorch
(tests/pretrained/make_reference.py says how to rerun it): the tiny random BERT in
tests/pretrained/tiny-bert/, and all-MiniLM-L6-v2 from `make pretrained`.
"""

import json
import os

import numpy as np
import pytest

from amptrain.config.pretrained import read_checkpoint
from amptrain.data.vocabulary import CLS, SEP, WordPiece, load_vocabulary

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "tiny-bert")
MINILM = os.path.join(os.path.dirname(os.path.dirname(HERE)), "pretrained", "all-MiniLM-L6-v2")


def encoder_states(folder, reference_name, features=None):
    """(amptrain's piece ids, reference ids, amptrain's float32 states, reference states) of
    each reference sentence."""
    import tensorflow as tf

    from amptrain.models.pretrained import load_encoder

    checkpoint = read_checkpoint(folder)
    with open(os.path.join(HERE, f"reference-{reference_name}.json"), encoding="utf-8") as f:
        reference = json.load(f)["sentences"]
    tokenizer = WordPiece(load_vocabulary(checkpoint.vocabulary_path), lowercase=checkpoint.lowercase)
    encoder = load_encoder(checkpoint, "float32", dropout=0.0)
    results = []
    for record in reference:
        pieces = tokenizer.encode([record["text"]])[0]
        ids = [tokenizer.token_id(CLS), *pieces.tolist(), tokenizer.token_id(SEP)]
        batch = tf.constant([ids], tf.int32)
        states = encoder(
            {"token_ids": batch, "segment_ids": tf.zeros_like(batch), "padding_mask": tf.ones_like(batch)},
            training=False,
        )["sequence_output"][0].numpy()
        results.append((ids, record["ids"], states[:, :features] if features else states, np.array(record["states"])))
    return results


def test_tiny_checkpoint_tokenizes_and_encodes_as_transformers():
    for ids, reference_ids, states, reference in encoder_states(TINY, "tiny-bert"):
        assert ids == reference_ids
        assert np.abs(states - reference).max() < 1e-4
        assert np.abs(reference).max() > 0.5  # states of real magnitude, not a degenerate zero


@pytest.mark.slow
def test_minilm_tokenizes_and_encodes_as_transformers():
    assert os.path.isfile(os.path.join(MINILM, "model.safetensors")), f"{MINILM}: run `make pretrained` first"
    for ids, reference_ids, states, reference in encoder_states(MINILM, "minilm", features=8):
        assert ids == reference_ids
        assert np.abs(states - reference).max() < 1e-4


def test_a_keras_hub_preset_folder_loads_the_same_weights(tmp_path):
    """The tiny BERT saved as a keras-hub preset: read with its own vocabulary and casing,
    and built with the same weights (keras-hub's presets keep its tanh GELU, so the states
    differ from the Hugging Face folder's by that alone)."""
    import keras_hub
    import tensorflow as tf

    from amptrain.models.pretrained import load_encoder

    preset = str(tmp_path / "preset")
    keras_hub.models.BertBackbone.from_preset(TINY).save_to_preset(preset)
    keras_hub.models.BertTokenizer.from_preset(TINY).save_to_preset(preset)
    checkpoint, original = read_checkpoint(preset), read_checkpoint(TINY)
    assert checkpoint.layout == "keras_hub" and checkpoint.activation == "gelu_approximate"
    assert checkpoint.shape() == original.shape() and checkpoint.lowercase
    assert load_vocabulary(checkpoint.vocabulary_path) == load_vocabulary(original.vocabulary_path)
    ids = tf.constant([[2, 40, 41, 42, 3]], tf.int32)
    inputs = {"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": tf.ones_like(ids)}
    a = load_encoder(checkpoint, "float32", 0.0)(inputs)["sequence_output"].numpy()
    b = load_encoder(original, "float32", 0.0)(inputs)["sequence_output"].numpy()
    assert 0 < np.abs(a - b).max() < 2e-2
