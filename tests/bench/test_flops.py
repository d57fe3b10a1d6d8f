"""The FLOPs count on tiny dimensions, by hand: a training step costs 6 FLOPs a matrix-product
parameter a token, and 6 · attention width · length a token for the scores and weighted sums
(width: heads · (key_dim + value_dim) an attention layer). A model the count cannot see into
has no figure (None), and MFU says unknown wherever it is shown."""

import os
import sys
import time
from types import SimpleNamespace

import keras
import pytest
from conftest import ROOT

from amptrain.bench.report import format_table, mfu_unknown
from amptrain.bench.runner import add_ratios
from amptrain.config import ModelConfig
from amptrain.engine.run_log import Window
from amptrain.engine.utilisation import Utilisation
from amptrain.hardware.flops import count_flops, peak_flops, training_flops_per_token
from amptrain.tasks.classification.model import build_classifier


def sequence_model(*layers, length=10, width=8):
    inputs = keras.Input((length, width))
    x = inputs
    for layer in layers:
        x = layer(x)
    return keras.Model(inputs, x)


# === Built-in models: today's figures ===


def test_training_flops_per_token_of_a_tiny_classifier():
    # hidden 16, feed-forward 32, 2 layers, 3 classes, vocabulary 64 (embeddings get no credit)
    model = build_classifier(
        64, 32, 3, ModelConfig(num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32), "float32"
    )
    per_layer = 16 * 48 + 16 * 16 + 16 * 32 + 32 * 16  # qkv, attention output, ffn in, ffn out = 2048
    head = 16 * 3
    assert count_flops(model).matmul_parameters == 2 * per_layer + head == 4144
    # 6 * 4144 + 2 layers * 12 * 16 * 20 (sequence length 20)
    assert training_flops_per_token(model, 20) == 24864 + 7680 == 32544


def test_training_flops_per_token_of_a_tiny_tagger():
    from amptrain.tasks.ner.model import build_tagger

    config = ModelConfig(num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32)
    model = build_tagger(64, 32, 5, config, "mixed_bfloat16", num_shapes=6, num_chars=20)
    # The classifier's two blocks (4,096), a 16 x 5 head (80); the character encoder's
    # convolution, a Dense over a character and its neighbours (3 * 32 x 128 = 12,288), and
    # its projection (128 x 16 = 2,048), per token as today. 18,512 in all.
    # 6 * 18,512 + 2 layers * 12 * 16 * 10 = 111,072 + 3,840
    assert training_flops_per_token(model, 10) == 111072 + 3840 == 114912


def tiny_translator(tie_embeddings):
    from amptrain.tasks.translation.model import Translator

    c = SimpleNamespace(
        num_layers=1,
        num_decoder_layers=1,
        hidden_dim=8,
        num_heads=2,
        intermediate_dim=16,
        dropout=0.0,
        tie_embeddings=tie_embeddings,
    )
    return Translator(40, 40, 16, c, "float32", shared_embedding=tie_embeddings).build_all()


def test_training_flops_per_token_of_a_tiny_translator():
    # Encoder block: qkv 8x24 + output 8x8 + ffn 8x16 + 16x8 = 192 + 64 + 256 = 512.
    # Decoder block: self 8x8 + 8x16 + 8x8, cross the same (256 each), ffn 256 = 768.
    # Output projection, tied: 8 x 40 = 320. Matmul parameters 512 + 768 + 320 = 1,600.
    # Attention: encoder self, decoder self and cross: 3 x 12 x 8 x 10 = 2,880.
    # A source and a target token together: 6 x 1,600 + 2,880 = 12,480; a token: 6,240.
    assert training_flops_per_token(tiny_translator(True), sequence_length=10) == 6240
    # Untied, the projection is a kernel of its own, 8 x 40 as well (a count that
    # missed it would say 5,280).
    assert training_flops_per_token(tiny_translator(False), sequence_length=10) == 6240


# === A user's model ===


def test_dense_layers_count_their_kernels_only():
    inputs = keras.Input((5,), dtype="int32")
    x = keras.layers.Embedding(100, 8)(inputs)
    x = keras.layers.Dense(4)(x)  # 8 x 4 kernel; its bias is no matmul
    x = keras.layers.Dropout(0.1)(keras.layers.Activation("relu")(keras.layers.LayerNormalization()(x)))
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling1D()(x))
    assert count_flops(model).matmul_parameters == 32
    assert training_flops_per_token(model, 5) == 192  # 6 * 32; no attention layer


def test_frozen_kernels_count_4_a_parameter_and_lora_adapters_6():
    """What the step computes: a frozen kernel has no weight gradient (forward 2, its input's
    gradient 2); LoRA's A (8 x 2) and B (2 x 4) are trained products of their own."""
    frozen, adapted, trained = keras.layers.Dense(4), keras.layers.Dense(4), keras.layers.Dense(4)
    model = sequence_model(frozen, adapted, keras.layers.Dense(8), trained, width=8)
    frozen.trainable = False
    adapted.enable_lora(2)  # its 4 x 4 kernel frozen; A 4 x 2, B 2 x 4
    count = count_flops(model)
    # frozen: 8 x 4 + 4 x 4; trained: 4 x 8 + 8 x 4, and the adapters 8 + 8
    assert (count.frozen_parameters, count.matmul_parameters) == (32 + 16, 32 + 32 + 16)
    assert training_flops_per_token(model, 10) == 4 * 48 + 6 * 80 == 672


def test_multi_head_attention_counts_its_projections_and_scores():
    inputs = keras.Input((10, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3)(inputs, inputs)
    model = keras.Model(inputs, attended)
    # EinsumDense kernels: query and key 8 x 2 x 4 = 64 each, value 8 x 2 x 3 = 48, output
    # 2 x 3 x 8 = 48: 224 parameters. Width 2 heads * (4 + 3) = 14: scores 2 * 2 * 4 * L and
    # weighted sum 2 * 2 * 3 * L forward a query token.
    assert count_flops(model).matmul_parameters == 224
    assert count_flops(model).attention_width == 14
    # 6 * 224 + 6 * 14 * 10 = 1,344 + 840
    assert training_flops_per_token(model, 10) == 1344 + 840 == 2184


def test_the_classic_recipes_model():
    sys.path.insert(0, os.path.join(ROOT, "examples", "classic_recipe"))
    from classic_recipe import build_transformer_model

    model = build_transformer_model(vocabulary_size=100, max_length=16, hidden_dim=8)
    # Its CustomAttention (no weights of its own) holds a MultiHeadAttention of 4 heads of 2:
    # query, key, value 8 x 4 x 2 = 64 each, output 4 x 2 x 8 = 64: 256. Feed-forward 8 x 16
    # + 16 x 8 = 256, logits 8 x 2 = 16: 528 parameters. Width 4 * (2 + 2) = 16.
    count = count_flops(model)
    assert (count.matmul_parameters, count.attention_width, count.uncounted) == (528, 16, ())
    assert training_flops_per_token(model, 10) == 6 * 528 + 6 * 16 * 10 == 4128


def test_a_layer_called_twice_counts_twice():
    shared = keras.layers.Dense(8)  # 8 x 8, called twice in the graph (as ALBERT's blocks)
    inputs = keras.Input((4, 8))
    model = keras.Model(inputs, shared(shared(inputs)))
    assert training_flops_per_token(model, 4) == 6 * 2 * 64


def test_recurrent_layers_count_kernel_and_recurrent_kernel():
    model = sequence_model(keras.layers.LSTM(4), length=5, width=3)
    assert training_flops_per_token(model, 5) == 6 * (3 * 16 + 4 * 16)  # kernel 3 x 4·4, recurrent 4 x 4·4


class Scale(keras.layers.Layer):
    """A custom layer with a vector of its own: elementwise, negligible, no credit."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.scale


class OwnKernel(keras.layers.Layer):
    """A custom layer with a matrix of its own: a product the count does not know."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 4))

    def call(self, x):
        return x @ self.kernel


def test_a_layer_the_count_cannot_see_into_makes_it_unknown():
    assert training_flops_per_token(sequence_model(Scale(), keras.layers.Dense(4)), 10) == 6 * 32
    model = sequence_model(keras.layers.Dense(8), OwnKernel(name="mine"))
    assert training_flops_per_token(model, 10) is None
    (reason,) = count_flops(model).uncounted
    assert reason.split("/")[-1].startswith("mine (OwnKernel): own weights (8, 4)")  # path, class, why
    assert training_flops_per_token(sequence_model(keras.layers.Conv1D(4, 3)), 10) is None
    per_position = keras.layers.EinsumDense("abc,bcd->abd", output_shape=(10, 4))  # a kernel a position
    assert training_flops_per_token(sequence_model(per_position), 10) is None


def bench_row(**measured):
    """A bench row as `add_ratios` makes it from a worker's result, against a 1e6 FLOP/s peak."""
    row = {"precision": "float32", "jit": False, "steps_per_execution": 1, "batch_size": 8}
    row.update(real_tokens_per_second=100.0, padded_tokens_per_second=150.0, **measured)
    return add_ratios([row], {"float32": (1e6, "CPU test")}, 8)[0]


def test_unknown_flops_leave_mfu_unknown():
    model = sequence_model(OwnKernel())
    utilisation = Utilisation.for_run(model, "float32", strategy=None)  # no peak measured for it
    window = Window()
    window.started = time.time() - 2
    window.add({"loss_total": 1.0, "applied_steps": 1, "overflow_steps": 0, "tokens": [600, 800], "examples": 10,
                "grad_norm": 1.0}, 1)  # fmt: skip
    assert utilisation.mfu(window) is None and utilisation.figures(window)["mfu"] is None
    row = bench_row(flops_per_token=None, uncounted_layers=count_flops(model).uncounted)
    assert row["mfu"] is None and row["mfu_padded"] is None
    assert format_table([row]).splitlines()[1].split()[12:14] == ["-", "-"]  # MFU, MFU padded
    assert mfu_unknown([row]).startswith("MFU unknown (-): the model's FLOPs cannot be counted (")
    assert "(OwnKernel): own weights" in mfu_unknown([row])


def test_data_sheet_peaks():
    assert peak_flops("mixed_bfloat16", "NVIDIA A100-SXM4-80GB")[0] == 312e12
    assert peak_flops("float32", "NVIDIA A100-SXM4-80GB")[0] == 156e12  # tf32
    assert peak_flops("float32", "NVIDIA A10")[0] == 62.5e12  # not the A100's
    assert peak_flops("float32", "Tesla T4")[0] == 8.1e12
    assert peak_flops("mixed_float16", "Tesla V100-SXM2-16GB")[0] == 125e12
    assert peak_flops("float32", None) is None
    assert peak_flops("float32", "Some Unknown GPU") is None


def test_a_counted_model_has_its_mfu():
    row = bench_row(flops_per_token=1000.0)
    assert row["mfu"] == pytest.approx(0.1) and row["mfu_padded"] == pytest.approx(0.15)
    assert mfu_unknown([row]) == ""
