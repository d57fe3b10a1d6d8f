"""The precision audit's checks (`precision/audit.py`): each reads the traced graph or the
layers and returns findings, {"kind", "layer", "message", "note"} (a note is not a risk).

    findings = op_findings(graph, locate) + constant_findings(graph, locate) + ...
    for finding in merge(findings): ...              # one finding of a kind a layer

The kinds and what they mean are listed in `precision/audit.py`.
"""

import keras
import numpy as np
import tensorflow as tf

from amptrain.models.islands import island_reason
from amptrain.precision.audit_trace import BOOKKEEPING, HALF, LOSS_SCOPE, op_dtype, own_weights

FP16_MAX = 65504.0
_NORM_WHY = "layer-norm arithmetic: squares overflow float16 past 256 and a 1e-6 epsilon is subnormal there"
_SOFTMAX_WHY = "exp() overflows float16 past 11 and the normalising sum loses the small terms"
# Arithmetic unsafe in float16, by op type: (risk kind, why).
FP16_UNSAFE = {
    "Softmax": ("fp16_softmax", _SOFTMAX_WHY),
    "LogSoftmax": ("fp16_softmax", _SOFTMAX_WHY),
    "Exp": ("fp16_exp", "exp() overflows float16 past 11 (a hand-written softmax?)"),
    "Rsqrt": ("fp16_norm", _NORM_WHY),
    "Sqrt": ("fp16_norm", _NORM_WHY),
    "SquaredDifference": ("fp16_norm", _NORM_WHY),
    "Square": ("fp16_norm", _NORM_WHY),
    "SparseSoftmaxCrossEntropyWithLogits": ("fp16_loss", "cross-entropy's log-sum-exp overflows float16"),
    "SoftmaxCrossEntropyWithLogits": ("fp16_loss", "cross-entropy's log-sum-exp overflows float16"),
}
SOFTMAX_OPS = frozenset(
    {"Softmax", "LogSoftmax", "Exp", "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"}
)
# Reductions whose running sum loses float16's 11 bits when long; their extent at or beyond this.
REDUCTIONS = frozenset({"Sum", "Mean"})
LARGE_REDUCTION = 256
# Ops an output passes through unchanged but for its dtype or shape (walking back to its source).
PASS_THROUGH = frozenset({"Identity", "IdentityN", "Cast", "Reshape", "Squeeze", "ExpandDims"})


def _finding(kind, layer, message, note=False):
    return {"kind": kind, "layer": layer, "message": message, "note": note}


def merge(findings):
    """One finding of a kind a layer (e.g. the loss's ops and its output), messages joined;
    each misaligned size stays a finding of its own."""
    merged = {}
    for finding in findings:
        separate = finding["kind"] == "size_alignment" and finding["message"]
        key = (finding["kind"], finding["layer"], finding["note"], separate)
        if key in merged:
            merged[key]["message"] += "; " + finding["message"]
        else:
            merged[key] = dict(finding)
    return list(merged.values())


def island_reasons(layers, compute, declared=False):
    """{path: why the layer is a float32 island, or None}. `declared`: the model was built
    under the policy, so a layer computing in float32 under a mixed policy had float32 given
    to its constructor (a float32 island the layer declared, as the classic recipe's
    `super().__init__(dtype="float32")`); the layers inside an island that compute in float32
    with it belong to it."""
    reasons = {}
    for path, layer in layers.items():
        reason = getattr(layer, "float32_reason", None)
        parent = reasons.get(path.rpartition("/")[0])
        pinned = compute in HALF and layer.compute_dtype == "float32" and not isinstance(layer, keras.Model)
        if not reason and pinned and parent:
            inside = f"inside the float32 island {path.rpartition('/')[0]}"
            reason = parent if parent.startswith("inside the float32 island") else inside  # named by the outermost
        elif not reason and pinned and declared:
            reason = f"declared float32 by its constructor (dtype={layer.dtype_policy.name!r})"
        reasons[path] = reason or island_reason(layer)
    return reasons


def float32_op_types(graph, locate):
    """The arithmetic op types each layer runs in float32 in its own name scope."""
    found = {}
    for op in graph.get_operations():
        if op.type not in BOOKKEEPING and op_dtype(op) == "float32" and not _local_upcast(op, locate):
            found.setdefault(locate(op.name), set()).add(op.type)
    return found


def _local_upcast(op, locate):
    """One op between casts from and back to half precision in its own layer: an
    accumulation upcast inside a Keras op (ops.mean does this), not a layer computing in
    float32 (whose float32 output the next layer casts back)."""
    inputs = [t for t in op.inputs if t.dtype.is_floating]
    consumers = [c for t in op.outputs for c in t.consumers()]
    return bool(
        inputs
        and consumers
        and all(t.op.type == "Cast" and t.op.inputs[0].dtype.name in HALF for t in inputs)
        and all(c.type == "Cast" and op_dtype(c) in HALF and locate(c.name) == locate(op.name) for c in consumers)
    )


def op_findings(graph, locate):
    """Softmax, exp, layer-norm and loss arithmetic in half precision, one finding a layer."""
    groups = {}
    for op in graph.get_operations():
        dtype, layer = op_dtype(op), locate(op.name)
        if dtype not in HALF:
            continue
        if layer == LOSS_SCOPE and op.type not in BOOKKEEPING:
            kind, why = "fp16_loss", "the loss belongs in float32: its log-sum-exp overflows and its sum loses bits"
        elif op.type in FP16_UNSAFE:
            kind, why = FP16_UNSAFE[op.type]
        else:
            continue
        groups.setdefault((kind, layer, dtype, why), set()).add(op.type)
    findings = []
    for (kind, layer, dtype, why), types in groups.items():
        ops = ", ".join(sorted(types))
        if dtype == "float16":
            findings.append(_finding(kind, layer, f"{ops} in float16: {why}"))
        else:
            message = f"{ops} in bfloat16: float32's range, but 8 bits of precision"
            findings.append(_finding(kind.replace("fp16", "bf16"), layer, message, note=True))
    return findings


def reduction_findings(graph, locate):
    """Long sums and means in half precision (a hand-written pooling or statistic): each
    added term is rounded to the running total's 11 (float16) or 8 (bfloat16) bits. Unknown
    dimensions are traced as 8: a reduction over the sequence shows with `inputs` of its length."""
    findings = []
    for op in graph.get_operations():
        dtype, layer = op_dtype(op), locate(op.name)
        if op.type not in REDUCTIONS or dtype not in HALF or layer == LOSS_SCOPE:
            continue
        extent = _reduced_extent(op)
        if extent is None or extent < LARGE_REDUCTION:
            continue
        why = f"{op.type} over {extent} elements in {dtype}: each term is rounded to the running total's precision"
        kind = "fp16_reduction" if dtype == "float16" else "bf16_reduction"
        findings.append(_finding(kind, layer, why, note=dtype != "float16"))
    return findings


def _reduced_extent(op):
    """How many elements a Sum/Mean op adds up, when its shape and axes are static."""
    shape = op.inputs[0].shape
    axes = tf.get_static_value(op.inputs[1])
    if shape.rank is None or axes is None:
        return None
    dims = [shape[int(a)] for a in np.atleast_1d(axes)]
    return None if None in dims else int(np.prod(dims))


def island_input_findings(graph, locate, layers, reasons):
    """Half-precision arithmetic inside a float32 island: a float16 input reached it uncast
    (Keras casts a layer's call arguments, but not a tensor it reads otherwise, nor when the
    layer turns that off), so the island computes in float16 all the same."""
    pinned = {path for path, layer in layers.items() if reasons[path] and layer.compute_dtype == "float32"}
    groups = {}
    for op in graph.get_operations():
        layer = locate(op.name)
        if layer in pinned and op.type not in BOOKKEEPING and op_dtype(op) in HALF:
            groups.setdefault((layer, op_dtype(op)), set()).add(op.type)
    findings = []
    for (layer, dtype), types in groups.items():
        message = (
            f"a float32 island fed {dtype} with no cast: {', '.join(sorted(types))} run in {dtype}; "
            "cast its inputs to float32 at the top of call"
        )
        findings.append(_finding("fp16_into_island", layer, message, note=dtype == "bfloat16"))
    return findings


def constant_findings(graph, locate):
    """float16 constants beyond ±65504 (they are ±inf there), e.g. a -1e9 attention mask."""
    findings = []
    for op in graph.get_operations():
        value = _fp16_constant(op)
        if value is None:
            continue
        beyond = value[~np.isfinite(value) | (np.abs(value) > FP16_MAX)]
        if not beyond.size:
            continue
        shown = f"{beyond.flat[0]:g}"
        if _reaches(op, SOFTMAX_OPS):
            message = (
                f"mask value {shown} is beyond float16's ±65504 (it is ±inf there): a fully masked row "
                "(a padding row) makes the softmax NaN; mask the scores in float32"
            )
            findings.append(_finding("fp16_mask_range", locate(op.name), message))
        else:
            findings.append(_finding("fp16_constant_range", locate(op.name), f"constant {shown} is ±inf in float16"))
    return findings


def _fp16_constant(op):
    """The values of a float16 constant (or of a constant cast to float16), else None."""
    if op.type == "Const" and op.outputs[0].dtype == tf.float16:
        return tf.make_ndarray(op.get_attr("value")).astype(np.float64)
    if op.type == "Cast" and op.outputs[0].dtype == tf.float16 and op.inputs[0].op.type == "Const":
        return tf.make_ndarray(op.inputs[0].op.get_attr("value")).astype(np.float64)
    return None


def _reaches(op, types, depth=8):
    """Whether an op of `types` consumes `op`'s output within `depth` ops."""
    frontier = {op}
    for _ in range(depth):
        frontier = {c for o in frontier for t in o.outputs for c in t.consumers()}
        if any(c.type in types for c in frontier):
            return True
    return False


def output_findings(outputs, losses, locate):
    """Model outputs (logits) computed in half precision, even when cast afterwards; a half loss."""
    findings = []
    for tensor in outputs:
        source, dtype = _half_source(tensor)
        if dtype is None:
            continue
        layer = locate(source.op.name)
        if dtype == "float16":
            message = 'the model\'s output (logits) is computed in float16; give its last layer dtype="float32"'
            findings.append(_finding("fp16_logits", layer, message))
        else:
            findings.append(_finding("bf16_logits", layer, "the model's output (logits) is in bfloat16", note=True))
    for tensor in losses:
        if tensor.dtype.name in HALF:
            message = f"the loss comes out in {tensor.dtype.name}; compute it in float32"
            findings.append(_finding("fp16_loss", LOSS_SCOPE, message, note=tensor.dtype.name == "bfloat16"))
    return findings


def _half_source(tensor):
    """Walks back from an output through casts and reshapes to the op that computed it;
    returns its output and the half dtype met on the way (None when all is float32)."""
    half = None
    while True:
        half = half or (tensor.dtype.name if tensor.dtype.name in HALF else None)
        if tensor.op.type not in PASS_THROUGH or not tensor.op.inputs:
            return tensor, half
        tensor = tensor.op.inputs[0]


def policy_findings(layers, float32_ops, compute, policy, reasons):
    """Layers that compute in another dtype than the policy's without declaring why, or
    keep variables that are not float32. `reasons`: `island_reasons`."""
    findings = []
    declare = "without declaring a float32 island (amptrain.models.islands)"
    for path, layer in layers.items():
        reason = reasons[path]
        # A nested model only routes tensors: its own dtype policy is not a computation.
        dtype = compute if isinstance(layer, keras.Model) else layer.compute_dtype
        if dtype != compute and not (dtype == "float32" and reason):
            message = f"computes in {dtype} under {policy}" + (f" {declare}" if dtype == "float32" else "")
            findings.append(_finding("ignored_policy", path, message))
        elif float32_ops.get(path) and not reason:
            ops = ", ".join(sorted(float32_ops[path]))
            findings.append(_finding("ignored_policy", path, f"runs {ops} in float32 under {policy} {declare}"))
        odd = sorted({v.dtype for v in own_weights(layer)} - {"float32"})
        if odd:
            message = f"keeps variables in {', '.join(odd)}: updates smaller than their precision are lost"
            findings.append(_finding("ignored_policy", path, message))
    return findings


def loss_scale_findings(compute, scaling):
    if compute == "float16" and scaling == "none":
        message = (
            "float16 without loss scaling: gradients below 6e-8 (float16's smallest subnormal) become 0; "
            "set precision.loss_scale to auto or dynamic"
        )
        return [_finding("no_loss_scale", None, message)]
    if compute != "float16" and scaling != "none":
        message = f"loss scaling ({scaling}) under {compute}: only float16 needs it"
        return [_finding("loss_scale", None, message, note=True)]
    return []


def size_findings(layers, sizes, compute, reasons):
    """Dimensions that are not multiples of 8: half-precision matmuls on tensor cores (and
    XLA's tiles) want them. Notes under float32, where they would matter after a switch."""
    used = {}
    for path, layer in layers.items():
        # What computes in half precision, or would under a mixed policy (not the islands).
        if layer.compute_dtype != "float32" or (compute == "float32" and not reasons[path]):
            for variable in own_weights(layer):
                for dim in variable.shape if len(variable.shape) >= 2 else ():
                    used.setdefault(int(dim), []).append(path)
    named = {}
    for name, value in sizes.items():
        named.setdefault(int(value), []).append(name)
    findings = []
    for value in sorted(set(used) | set(named)):
        if value % 8 == 0:
            continue
        names = f" ({', '.join(named[value])})" if value in named else ""
        paths = list(dict.fromkeys(used.get(value, ())))
        message = f"{value}{names} is not a multiple of 8, which tensor cores want{_used_by(paths)}"
        findings.append(_finding("size_alignment", paths[0] if paths else None, message, note=compute not in HALF))
    return findings


def _used_by(paths, shown=4):
    if not paths:
        return ""
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return f"; used by {', '.join(paths[:shown])}{more}"
