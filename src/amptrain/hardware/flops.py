"""Training FLOPs per token, counted from the built model, and the hardware's peak.

    per_token = training_flops_per_token(model, sequence_length=128)
    peak, source = peak_flops("mixed_bfloat16")     # a table entry, or a measured matmul on a CPU
    mfu = per_token * real_tokens_per_second / peak

The count is the usual analytic one (Kaplan et al. 2020; PaLM's MFU): a training step
costs 6 FLOPs per matrix-product parameter per token (2 forward, 4 backward), plus the
attention scores and the weighted sum, 2 · 2 · hidden · length forward per token and
layer, so 12 · hidden · length with the backward pass. Embedding lookups get no credit.
The parameters are counted from the model itself (every rank-2 `kernel` of a Dense layer:
attention projections, feed-forward, heads and output projections), and the attention
term from its attention layers, so the same function counts an encoder, a tagger or an
encoder-decoder. As in the formula, a classifier's head is counted per token although it
runs once a sequence (it is a few hundred parameters).
"""

import time

import keras

from amptrain.models.blocks import Attention, MultiHeadSelfAttention
from amptrain.models.layer_tree import walk

# Dense peak FLOP/s (no sparsity) per chip, from the vendors' data sheets (SXM parts where
# there are two). None: no such arithmetic on that chip.
PEAKS = {
    # name: (fp32, tf32, fp16/bf16 tensor)
    "V100": (15.7e12, None, 125e12),
    "T4": (8.1e12, None, 65e12),
    "A10": (31.2e12, 62.5e12, 125e12),
    "A100": (19.5e12, 156e12, 312e12),
    "L4": (30.3e12, 60e12, 121e12),
    "H100": (67e12, 494.5e12, 989.5e12),
    "H200": (67e12, 494.5e12, 989.5e12),
    "TPU v4": (None, None, 275e12),
    "TPU v5e": (None, None, 197e12),
}
# Checked in this order: "A10" must not catch an "A100".
_NAMES = ("H200", "H100", "A100", "A10", "L4", "T4", "V100", "TPU v5e", "TPU v4")


def attention_layers(model):
    """The attention layers of `model` (self-attention of the encoders, and the
    translator's self- and cross-attention)."""
    return [layer for layer in walk(model) if isinstance(layer, (MultiHeadSelfAttention, Attention))]


def matmul_parameters(model):
    """Parameters that enter matrix products: every rank-2 Dense kernel."""
    total = 0
    for layer in walk(model):
        if isinstance(layer, keras.layers.Dense) and len(layer.kernel.shape) == 2:
            total += int(layer.kernel.shape[0]) * int(layer.kernel.shape[1])
    return total


def training_flops_per_token(model, sequence_length):
    """6 · matmul parameters + 12 · hidden · length for each attention layer.

    An encoder-decoder (the translator) runs its encoder on source tokens and its decoder
    and output projection on target tokens, and the tokens counted are both sides': a
    pair of one source and one target token costs the sum over every part, so a token
    costs half of it (sides of equal length assumed; `sequence_length` is a side's)."""
    from amptrain.models.translator import OutputProjection, Translator

    attention = sum(12 * layer.hidden_dim * sequence_length for layer in attention_layers(model))
    parameters = matmul_parameters(model)
    # The output projection of a translator is a matrix product with no Dense kernel when
    # tied to the embedding.
    for layer in walk(model):
        if isinstance(layer, OutputProjection) and layer.tied_embedding is not None:
            parameters += int(layer.tied_embedding.embeddings.shape[0]) * int(layer.tied_embedding.embeddings.shape[1])
    per_token = 6 * parameters + attention
    return per_token / 2 if isinstance(model, Translator) else per_token


def peak_flops(policy, device_name=None, tf32=True):
    """(peak FLOP/s, where it comes from) for `policy` on the first accelerator, or None
    when the device is not in the table (a CPU: measure it with `measure_matmul_peak`)."""
    if not device_name:
        return None
    for name in _NAMES:
        if name.lower() in device_name.lower():
            fp32, tf32_peak, half = PEAKS[name]
            if policy != "float32":
                return half, f"{name} fp16/bf16 tensor-core peak (data sheet)"
            if tf32 and tf32_peak:
                return tf32_peak, f"{name} tf32 peak (data sheet; TensorFlow runs float32 matmuls as tf32 there)"
            if fp32:
                return fp32, f"{name} fp32 peak (data sheet)"
            return half, f"{name} has no fp32 peak; its bf16 peak (data sheet)"
    return None


def measure_matmul_peak(dtype="float32", size=2048, repeats=10):
    """FLOP/s of a `size`×`size` matrix product in `dtype`: the best of `repeats` timed runs."""
    import tensorflow as tf

    a = tf.random.normal((size, size), dtype=tf.float32)
    a = tf.cast(a, dtype)
    product = tf.function(lambda x: tf.reduce_sum(tf.cast(tf.linalg.matmul(x, x), tf.float32)))
    product(a).numpy()  # trace and warm up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        product(a).numpy()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best
