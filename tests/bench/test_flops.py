"""The FLOPs count on tiny dimensions, by hand."""

import keras

from amptrain.bench.flops import matmul_parameters, peak_flops, training_flops_per_token
from amptrain.config import ModelConfig
from amptrain.models.classifier import build_classifier


def test_training_flops_per_token_of_a_tiny_classifier():
    # hidden 16, feed-forward 32, 2 layers, 3 classes, vocabulary 64 (embeddings get no credit)
    model = build_classifier(64, 32, 3, ModelConfig(num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32), "float32")
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
