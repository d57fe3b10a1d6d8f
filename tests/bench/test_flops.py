"""The FLOPs count on tiny dimensions, by hand."""

import keras

from amptrain.config import ModelConfig
from amptrain.hardware.flops import matmul_parameters, peak_flops, training_flops_per_token
from amptrain.models.classifier import build_classifier


def test_training_flops_per_token_of_a_tiny_classifier():
    # hidden 16, feed-forward 32, 2 layers, 3 classes, vocabulary 64 (embeddings get no credit)
    model = build_classifier(
        64, 32, 3, ModelConfig(num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32), "float32"
    )
    per_layer = 16 * 48 + 16 * 16 + 16 * 32 + 32 * 16  # qkv, attention output, ffn in, ffn out = 2048
    head = 16 * 3
    assert matmul_parameters(model) == 2 * per_layer + head == 4144
    # 6 * 4144 + 2 layers * 12 * 16 * 20 (sequence length 20)
    assert training_flops_per_token(model, 20) == 24864 + 7680 == 32544


def test_matmul_parameters_count_only_dense_kernels():
    inputs = keras.Input((5,), dtype="int32")
    x = keras.layers.Embedding(100, 8)(inputs)
    x = keras.layers.Dense(4)(x)  # 8 x 4 kernel; its bias is no matmul
    model = keras.Model(inputs, keras.layers.LayerNormalization()(x))
    assert matmul_parameters(model) == 32
    assert training_flops_per_token(model, 5) == 192  # no attention layer


def test_data_sheet_peaks():
    assert peak_flops("mixed_bfloat16", "NVIDIA A100-SXM4-80GB")[0] == 312e12
    assert peak_flops("float32", "NVIDIA A100-SXM4-80GB")[0] == 156e12  # tf32
    assert peak_flops("float32", "NVIDIA A10")[0] == 62.5e12  # not the A100's
    assert peak_flops("float32", "Tesla T4")[0] == 8.1e12
    assert peak_flops("mixed_float16", "Tesla V100-SXM2-16GB")[0] == 125e12
    assert peak_flops("float32", None) is None
    assert peak_flops("float32", "Some Unknown GPU") is None


def test_training_flops_per_token_of_a_tiny_translator():
    from types import SimpleNamespace

    from amptrain.models.translator import Translator

    c = SimpleNamespace(
        num_layers=1,
        num_decoder_layers=1,
        hidden_dim=8,
        num_heads=2,
        intermediate_dim=16,
        dropout=0.0,
        tie_embeddings=True,
    )
    model = Translator(40, 40, 16, c, "float32", shared_embedding=True).build_all()
    # Encoder block: qkv 8x24 + output 8x8 + ffn 8x16 + 16x8 = 192 + 64 + 256 = 512.
    # Decoder block: self 8x8 + 8x16 + 8x8, cross the same (256 each), ffn 256 = 768.
    # Output projection, tied: 8 x 40 = 320. Matmul parameters 512 + 768 + 320 = 1,600.
    # Attention: encoder self, decoder self and cross: 3 x 12 x 8 x 10 = 2,880.
    # A source and a target token together: 6 x 1,600 + 2,880 = 12,480; a token: 6,240.
    assert training_flops_per_token(model, sequence_length=10) == 6240
