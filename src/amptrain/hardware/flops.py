"""Training FLOPs per token, counted from the built model, and the hardware's peak.

    per_token = training_flops_per_token(model, sequence_length=128)  # None: cannot be counted
    count = count_flops(model)          # what was counted; count.uncounted names what was not
    peak, source = peak_flops("mixed_bfloat16")     # a table entry, or a measured matmul on a CPU
    mfu = per_token * real_tokens_per_second / peak

The count is the usual analytic one (Kaplan et al. 2020; PaLM's MFU): a training step
costs 6 FLOPs per matrix-product parameter per token (2 forward, 4 backward), plus the
attention scores and the weighted sum, 2 · heads · (key_dim + value_dim) · length forward
per query token and layer, three times that for training (12 · hidden · length when
key_dim = value_dim = hidden / heads). It is read from the model's layers, so the same
function counts amptrain's models and a user's:

- matrix-product parameters, each once a token: a `Dense` kernel (its whole shape), an
  `EinsumDense` kernel (a token-wise projection: no kernel axis is also an axis of both
  its input and its output), an RNN cell's kernel and recurrent kernel (LSTM, GRU,
  SimpleRNN), the translator's output projection (its kernel, or the embedding it is tied to);
- attention terms: amptrain's `MultiHeadSelfAttention` and `Attention` (hidden wide),
  `keras.layers.MultiHeadAttention` (keras-hub's subclasses too; its projections are
  EinsumDense) and `keras.layers.GroupQueryAttention`; keys as long as the queries;
- no credit: embeddings (a lookup), normalisation, and weights of rank below 2 (biases,
  scales); layers without weights (dropout, activations, pooling, reshapes) add nothing.

A layer counts once per call: a layer a functional graph calls several times (ALBERT's
shared blocks) counts each call. As in the formula, a classifier's head is counted per
token although it runs once a sequence (it is a few hundred parameters).

What the step computes, not what a full fine-tuning would: a frozen kernel (a variable not
trainable: LoRA's base, a quantized one, a layer the user froze) has no weight gradient, so
it costs 4 a parameter (forward, and the gradient of its input; the first frozen products,
whose input needs none, are counted 4 too). LoRA's adapters (Keras' `enable_lora`: A and B
on a Dense or EinsumDense) are trained products of their own, 6 a parameter (x A, then B).
Keras merges them into the kernel once a step (kernel + A B, rank · inputs · outputs
multiplications a step, not a token): not counted.

Unknown rather than wrong: the count is None (`FlopsCount.uncounted` names the layers)
when a layer has trainable weights of rank 2 or more of its own, in a class the count does
not know (a convolution, a custom layer's kernel; weights held through known sublayers are
fine, as in the classic recipe's attention wrapper), when an EinsumDense kernel is not
token-wise, for `keras.layers.Attention` / `AdditiveAttention` (products sized by their
inputs, which the layer does not hold), and for a reversible embedding called more than
once (keras-hub's tied output projection, a product the lookup hides). What the count cannot
see at all: products a layer without weights computes in its own code (a hand-written
attention's scores): they are missed, not flagged.

No fallback through TensorFlow's graph cost (`tf.compat.v1.profiler` float operations on
a traced function): it has no statistics for `Einsum` (every EinsumDense and attention
product), needs fixed shapes, counts elementwise work the analytic figure leaves out, and
costs a trace of the model; a figure that differs by construction from the built-in models'
is not MFU.
"""

import dataclasses
import math
import time

import keras

from amptrain.models.blocks import Attention, MultiHeadSelfAttention
from amptrain.models.layer_tree import children

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


@dataclasses.dataclass(frozen=True)
class FlopsCount:
    """What `count_flops` found in a model: enough for the FLOPs per token at any length."""

    matmul_parameters: int = 0  # trained weights multiplied once a token: 6 training FLOPs each
    attention_width: int = 0  # sum over attention layers of heads · (key_dim + value_dim)
    uncounted: tuple = ()  # "path (Class): why" of each layer the count cannot see into
    encoder_decoder: bool = False  # a token is half a source-target pair
    frozen_parameters: int = 0  # frozen weights multiplied once a token: 4 each (no weight gradient)

    def per_token(self, sequence_length):
        """Training FLOPs per token at `sequence_length` (a padded length; linear in it), or
        None when a layer could not be counted."""
        if self.uncounted:
            return None
        # forward: 2 a parameter, 2 · width · length of scores and weighted sums; backward twice
        # that, or once for a frozen weight (its input's gradient alone)
        per_token = 6 * self.matmul_parameters + 4 * self.frozen_parameters
        per_token += 6 * self.attention_width * sequence_length
        # An encoder-decoder runs its encoder on source tokens, its decoder and output
        # projection on target tokens, and the tokens counted are both sides': a pair of one
        # source and one target token costs the sum over every part, so a token half of it
        # (sides of equal length assumed; `sequence_length` is a side's).
        return per_token / 2 if self.encoder_decoder else per_token


def training_flops_per_token(model, sequence_length):
    """Training FLOPs per token of the built `model` at `sequence_length`, or None when a layer
    cannot be counted (`count_flops(model).uncounted` says which).

        training_flops_per_token(model, 128)  # 6 · matmul parameters + 6 · attention width · 128
    """
    return count_flops(model).per_token(sequence_length)


def count_flops(model):
    """The matrix-product parameters, attention width and uncounted layers of the built `model`."""
    parameters, frozen, width, uncounted = 0, 0, 0, []
    for layer, path, calls in _layers(model):
        found = _layer_count(layer, calls)
        if isinstance(found, str):
            uncounted.append(f"{path} ({type(layer).__name__}): {found}")
            continue
        products, width_here = found
        trained, held = products if isinstance(products, tuple) else (products, 0)
        parameters, frozen, width = parameters + trained * calls, frozen + held * calls, width + width_here * calls
    # A model whose tokens are half source, half target says so (the translator does).
    encoder_decoder = getattr(model, "encoder_decoder", False) is True
    return FlopsCount(parameters, width, tuple(uncounted), encoder_decoder, frozen)


def _layers(model):
    """(layer, path, calls a step) for the model and each nested layer once, depth first."""
    seen, stack = set(), [(model, model.name, 1)]
    while stack:
        layer, path, calls = stack.pop()
        if id(layer) in seen:  # a tied embedding is its owner's and its projection's
            continue
        seen.add(id(layer))
        yield layer, path, calls
        for child in reversed(children(layer)):
            stack.append((child, f"{path}/{child.name}", calls * _calls_in(layer, child)))


def _calls_in(parent, child):
    """How many times a functional `parent` calls `child` (its graph's nodes; Keras 3 keeps
    them in the private `_nodes_by_depth`); 1 for a layer that calls its sublayers in code."""
    nodes = getattr(parent, "_nodes_by_depth", None)
    if not isinstance(nodes, dict):
        return 1
    return max(1, sum(node.operation is child for depth in nodes.values() for node in depth))


def _layer_count(layer, calls):
    """(matmul parameters, attention width) of the layer's own work, or why it cannot be counted."""
    # A layer of a model's own that multiplies weights (a tied output projection, say) counts
    # them itself: `matmul_parameters()`, the weights multiplied once a token.
    counts_itself = callable(getattr(layer, "matmul_parameters", None))
    if (isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense) or counts_itself) and not layer.built:
        return "not built"
    if isinstance(layer, keras.layers.Dense):
        return _kernel_products(layer, _size(layer.kernel)), 0
    if isinstance(layer, keras.layers.EinsumDense):
        return _einsum_count(layer)
    if isinstance(layer, _RNN_CELLS):
        size = _size(layer.kernel) + _size(layer.recurrent_kernel)
        return ((size, 0) if layer.kernel.trainable else (0, size)), 0
    if isinstance(layer, MultiHeadSelfAttention | Attention):
        return 0, 2 * layer.hidden_dim
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return 0, layer.num_heads * (layer.key_dim + layer.value_dim)
    if isinstance(layer, keras.layers.GroupQueryAttention):
        return 0, layer.num_query_heads * 2 * layer.head_dim
    if counts_itself:  # and, when some of them are frozen, `frozen_matmul_parameters()`
        frozen = layer.frozen_matmul_parameters() if hasattr(layer, "frozen_matmul_parameters") else 0
        return (layer.matmul_parameters() - frozen, frozen), 0
    if isinstance(layer, keras.layers.Attention | keras.layers.AdditiveAttention):
        return "its scores are sized by its inputs, which the layer does not hold"
    if isinstance(layer, keras.layers.ReversibleEmbedding) and calls > 1:
        return "called more than once: one call may be its reverse, an output projection"
    if isinstance(layer, _NO_CREDIT) or _qualified_names(layer) & _NO_CREDIT_ELSEWHERE:
        return 0, 0
    own = _own_weights(layer)
    if any(w.trainable and len(w.shape) >= 2 for w in own):
        shapes = ", ".join(str(tuple(w.shape)) for w in own if len(w.shape) >= 2)
        return f"own weights {shapes} of a class the FLOPs count does not know"
    return 0, 0


# Token-wise matrix products of a recurrent layer, a time step each.
_RNN_CELLS = (keras.layers.LSTMCell, keras.layers.GRUCell, keras.layers.SimpleRNNCell)
# Weights that enter no matrix product: lookups, normalisation's scales, PReLU's slopes.
_NO_CREDIT = tuple(
    getattr(keras.layers, name)
    for name in (
        "Embedding",
        "LayerNormalization",
        "BatchNormalization",
        "GroupNormalization",
        "RMSNormalization",
        "UnitNormalization",
        "PReLU",
    )
    if hasattr(keras.layers, name)
)
# The same, in packages not imported here: keras-hub's learned position embedding (a lookup).
_NO_CREDIT_ELSEWHERE = {"keras_hub.src.layers.modeling.position_embedding.PositionEmbedding"}


def _qualified_names(layer):
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(layer).__mro__}


def _own_weights(layer):
    """The layer's weights that are not its sublayers'."""
    theirs = {id(w) for child in children(layer) for w in child.weights}
    return [w for w in layer.weights if id(w) not in theirs]


def _size(weight):
    return math.prod(int(d) for d in weight.shape)


def _einsum_count(layer):
    """An EinsumDense's kernel is multiplied once a token when each of its axes is contracted
    (input only) or produced (output only); an axis also in both (a kernel per position) is not."""
    inputs, output = layer.equation.replace("...", "").split("->")
    operand, kernel = inputs.split(",")
    shared = set(kernel) & set(operand) & set(output)
    if shared:
        return f"equation {layer.equation!r}: its kernel is not token-wise (axes {''.join(sorted(shared))})"
    return _kernel_products(layer, _size(layer.kernel)), 0


def _kernel_products(layer, size):
    """(trained, frozen) parameters multiplied once a token by a Dense or EinsumDense of a
    kernel of `size`: the kernel's (trained or frozen: its variable says, `_kernel` where
    Keras' `kernel` is the sum with LoRA's adapters or an unpacked int4), and LoRA's A and B."""
    variable = getattr(layer, "_kernel", None)
    trained = layer.trainable and (variable.trainable if variable is not None else True)
    products = (size, 0) if trained else (0, size)
    if getattr(layer, "lora_enabled", False):
        products = (products[0] + _size(layer.lora_kernel_a) + _size(layer.lora_kernel_b), products[1])
    return products


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
