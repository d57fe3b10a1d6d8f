"""Every model round-trips through its config: `from_config(get_config())`, Keras's
serialize/deserialize and a `.keras` file rebuild an equivalent model (same outputs on a
fixed batch once the weights are copied or loaded), with its dtype policy, its float32
islands and, for the translator, its tied embeddings and its cached decoder."""

import re

import keras
import numpy as np
import pytest

from amptrain.models.blocks import (
    Attention,
    MultiHeadSelfAttention,
    PreNormBlock,
    TokenAndPositionEmbedding,
)
from amptrain.models.islands import island_reason
from amptrain.models.pooling import MaskedMeanPooling
from amptrain.tasks.classification.model import build_classifier
from amptrain.tasks.language_model.model import CausalSelfAttention
from amptrain.tasks.ner.chars import CharWordEncoder
from amptrain.tasks.ner.model import build_tagger
from amptrain.tasks.translation.decoding import Search
from amptrain.tasks.translation.model import DECODER, OutputProjection, Translator
from amptrain.tasks.translation.settings import TranslationModel

TINY = TranslationModel(
    num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, dropout=0.1, num_decoder_layers=2
)
RNG = np.random.default_rng(0)
IDS = RNG.integers(3, 40, (2, 7)).astype(np.int32)
MASK = np.arange(7)[None] < np.array([[7], [4]])
IDS[~MASK] = 0
CHARS = RNG.integers(0, 20, (2, 7, 5)).astype(np.int32)


def build(kind, dtype):
    if kind == "classifier":
        return build_classifier(40, 16, 3, TINY, dtype)
    if kind == "tagger":
        return build_tagger(40, 16, 5, TINY, dtype, num_shapes=4, num_chars=20)
    return Translator(40, 40, 16, TINY, dtype, shared_embedding=True).build_all()


def features(kind):
    if kind == "translator":
        return {"source_ids": IDS, "source_mask": MASK, "target_ids": IDS, "target_mask": MASK}
    batch = {"token_ids": IDS, "padding_mask": MASK}
    if kind == "tagger":
        batch.update(shape_ids=IDS % 4, char_ids=CHARS)
    return batch


def outputs(model, kind):
    return keras.ops.convert_to_numpy(model(features(kind), training=False))


def islands(model):
    return {layer.name: island_reason(layer) for layer in model._flatten_layers() if island_reason(layer)}


def given_names(model):
    """The names of the model's layers, but for those Keras numbered (the translator's
    unnamed embedding dropout): a rebuilt model numbers them anew."""
    return [layer.name for layer in model.layers if not re.fullmatch(r"dropout_\d+", layer.name)]


def assert_equivalent(rebuilt, model, kind):
    assert type(rebuilt) is type(model) and rebuilt.name == model.name
    assert [w.shape for w in rebuilt.weights] == [w.shape for w in model.weights]
    assert islands(rebuilt) == islands(model)
    assert given_names(rebuilt) == given_names(model)
    for old, new in zip(model._flatten_layers(), rebuilt._flatten_layers()):  # unnamed ones are renamed
        assert (type(new), new.dtype_policy.name) == (type(old), old.dtype_policy.name)
    np.testing.assert_array_equal(outputs(rebuilt, kind), outputs(model, kind))


KINDS = ["classifier", "tagger", "translator"]


@pytest.mark.parametrize("kind", KINDS)
def test_from_config_rebuilds_an_equivalent_model(kind):
    keras.utils.set_random_seed(1)
    model = build(kind, "float32")
    rebuilt = type(model).from_config(model.get_config())
    if kind == "translator":
        rebuilt.build_all()
    rebuilt.set_weights(model.get_weights())
    assert_equivalent(rebuilt, model, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_serialize_keras_object_round_trips(kind):
    keras.utils.set_random_seed(1)
    model = build(kind, "float32")
    rebuilt = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    if kind == "translator":
        rebuilt.build_all()
    rebuilt.set_weights(model.get_weights())
    assert_equivalent(rebuilt, model, kind)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_keras_file_loads_an_equivalent_model(kind, dtype, tmp_path):
    keras.utils.set_random_seed(1)
    model = build(kind, dtype)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert_equivalent(loaded, model, kind)
    if dtype != "float32":  # the policy survives: half arithmetic, float32 variables and islands
        compute = {layer.compute_dtype for layer in loaded._flatten_layers() if "block" in type(layer).__name__.lower()}
        assert compute == {"bfloat16"}
        assert {w.dtype for w in loaded.weights} == {"float32"}
        assert "float32" in str(outputs(loaded, kind).dtype)


def test_a_loaded_translator_keeps_its_embeddings_tied_and_decodes_the_same(tmp_path):
    keras.utils.set_random_seed(2)
    model = Translator(40, 40, 16, TINY, "float32", shared_embedding=True).build_all()
    model.save(tmp_path / "translator.keras")
    loaded = keras.saving.load_model(tmp_path / "translator.keras")
    assert loaded.target_embedding is loaded.source_embedding
    assert loaded.output_projection.tied_embedding is loaded.target_embedding
    assert len(loaded.weights) == len(model.weights)  # no kernel of its own, no second embedding
    loaded.target_embedding.embeddings.assign(loaded.target_embedding.embeddings + 1.0)
    moved = keras.ops.convert_to_numpy(loaded(features("translator")))
    assert not np.allclose(moved, outputs(model, "translator"))  # the projection follows the embedding
    loaded = keras.saving.load_model(tmp_path / "translator.keras")
    for beam_size in (1, 3):
        search = {"max_length": 8, "start_id": 1, "end_id": 2, "beam_size": beam_size}
        expected = Search(model, **search)(IDS, MASK)
        assert Search(loaded, **search)(IDS, MASK).tolist() == expected.tolist()


def test_an_untied_translator_round_trips_with_its_own_output_kernel(tmp_path):
    config = TranslationModel(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, tie_embeddings=False)
    model = Translator(45, 40, 16, config, "float32").build_all()
    model.save(tmp_path / "untied.keras")
    loaded = keras.saving.load_model(tmp_path / "untied.keras")
    assert loaded.target_embedding is not loaded.source_embedding
    assert loaded.output_projection.tied_embedding is None
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(features("translator"))), outputs(model, "translator")
    )


LAYERS = {  # made in the test: a layer made at import would fail the whole module
    "embedding": lambda: TokenAndPositionEmbedding(40, 16, 16, dtype="mixed_bfloat16", name="embedding"),
    "self_attention": lambda: MultiHeadSelfAttention(16, 2, 0.1, dtype="mixed_bfloat16", name="attention"),
    "attention": lambda: Attention(16, 2, 0.1, dtype="mixed_bfloat16", name="cross"),
    "encoder_block": lambda: PreNormBlock(16, 2, 32, 0.1, dtype="mixed_bfloat16", name="encoder"),
    "decoder_block": lambda: PreNormBlock(16, 2, 32, 0.1, dtype="mixed_bfloat16", name="decoder", **DECODER),
    "causal_block": lambda: PreNormBlock(16, 2, 32, attention=CausalSelfAttention, dtype="mixed_bfloat16"),
    "chars": lambda: CharWordEncoder(20, 16, dtype="mixed_bfloat16", name="chars"),
    "pooling": lambda: MaskedMeanPooling(dtype="float32", name="pooling"),
    "projection": lambda: OutputProjection(40, dtype="float32", name="logits"),
    "tied_projection": lambda: OutputProjection(40, tied=True, dtype="float32", name="tied_logits"),
}


@pytest.mark.parametrize("name", LAYERS)
def test_every_custom_layer_round_trips_through_its_config(name):
    layer = LAYERS[name]()
    rebuilt = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(rebuilt) is type(layer)
    assert rebuilt.get_config() == layer.get_config()
    assert rebuilt.dtype_policy.name == layer.dtype_policy.name


def test_a_tied_projection_without_its_embedding_says_so():
    with pytest.raises(ValueError, match="tie_to"):
        OutputProjection(40, tied=True, name="logits").build((None, 16))
