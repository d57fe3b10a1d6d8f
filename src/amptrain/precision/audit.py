"""The precision audit behind `amptrain audit`: per layer, the dtype it computes in and the
dtype of its variables, whether it is a float32 island and why; and the precision risks.

    report = audit_model(model, "mixed_float16", loss_scale="auto", loss_fn=task.loss_fn,
                         targets=target_specs, sizes={"model.hidden_dim": 64})
    report["rows"]   # [{"path": "block_0/attention", "class": ..., "compute_dtype": "float16", ...}, ...]
    report["risks"]  # [] or [{"kind": "fp16_softmax", "layer": "block_0/attention", "message": ...}]
    print(format_report(report))

The risks are read from what runs, not from layer names: the model (and the loss on its
outputs) is traced once, in training mode, in a tf.function on a dummy batch, and each op
of the graph is mapped to the layer whose name scope it ran in. Risk kinds:

- `fp16_softmax`, `fp16_exp`, `fp16_norm`, `fp16_logits`, `fp16_loss`: that arithmetic in float16;
- `fp16_mask_range`: a float16 constant beyond ±65504 (so ±inf) that reaches a softmax
  (`fp16_constant_range` when it does not);
- `ignored_policy`: a layer computing in another dtype than the policy's without declaring
  a float32 island (`amptrain.models.islands`), or keeping variables that are not float32;
- `no_loss_scale`: float16 without loss scaling;
- `size_alignment`: a matrix dimension, or a size of the config, not a multiple of 8.

The same findings in bfloat16 (float32's range, 8 bits of precision) and misaligned sizes
under float32 are notes, not risks.
"""

import re

import keras
import numpy as np
import tensorflow as tf

from amptrain.models.islands import island_reason
from amptrain.models.layer_tree import children

HALF = ("float16", "bfloat16")
FP16_MAX = 65504.0
DUMMY_DIM = 8  # unknown batch and length dimensions of the traced dummy batch
LOSS_SCOPE = "loss"
# Ops that move or reinterpret data without arithmetic: one in float32 is no float32 compute.
BOOKKEEPING = frozenset(
    "Placeholder Const ReadVariableOp VarHandleOp Identity IdentityN Cast Reshape Transpose StridedSlice "
    "Slice GatherV2 ResourceGather Shape ShapeN Pack Unpack ConcatV2 ExpandDims Squeeze BroadcastTo Fill "
    "Tile ZerosLike OnesLike StopGradient Split SplitV Range NoOp".split()
)
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
# Ops an output passes through unchanged but for its dtype or shape (walking back to its source).
PASS_THROUGH = frozenset({"Identity", "IdentityN", "Cast", "Reshape", "Squeeze", "ExpandDims"})


def audit_model(model, policy, loss_scale="auto", inputs=None, loss_fn=None, targets=None, sizes=None):
    """Audits `model`, built under `policy` (a Keras dtype policy name); returns plain data:
    {"model", "policy", "compute_dtype", "loss_scale", "rows", "risks", "notes"}. A row a
    layer: path, class, compute_dtype, variable_dtype, island, reason, and float32_ops (the
    op types the layer itself runs in float32, under a mixed policy). A risk or note:
    kind, layer (a path, "loss", or None for the config), message.

    `inputs`: tf.TensorSpecs shaped like the model's input (default: a functional model's
    inputs); unknown dimensions become 8. `loss_fn(targets, outputs)` with `targets`
    (TensorSpecs) adds the loss to the trace. `loss_scale`: `precision.loss_scale`.
    `sizes`: named sizes to check for tensor-core alignment, e.g. {"model.hidden_dim": 64}.
    """
    compute = keras.DTypePolicy(policy).compute_dtype
    layers = layer_tree(model)
    graph, outputs, losses = _trace(model, inputs, loss_fn, targets)
    locate = _locator(model, layers)
    float32_ops = _float32_ops(graph, locate) if compute in HALF else {}
    scaling = loss_scaling(compute, loss_scale)
    findings = (
        _op_findings(graph, locate)
        + _constant_findings(graph, locate)
        + _output_findings(outputs, losses, locate)
        + _policy_findings(layers, float32_ops, compute, policy)
        + _loss_scale_findings(compute, scaling)
        + _size_findings(layers, sizes or {}, compute)
    )
    risks, notes = [], []
    for finding in _merge(findings):
        (notes if finding.pop("note") else risks).append(finding)
    return {
        "model": model.name,
        "policy": policy,
        "compute_dtype": compute,
        "loss_scale": scaling,
        "rows": _rows(layers, float32_ops),
        "risks": risks,
        "notes": notes,
    }


def loss_scaling(compute_dtype, loss_scale):
    """What `precision.loss_scale` means under `compute_dtype`: "dynamic", "fixed N" or "none"."""
    if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
        return f"fixed {loss_scale:g}"
    if loss_scale == "auto":
        return "dynamic" if compute_dtype == "float16" else "none"
    return loss_scale


def _finding(kind, layer, message, note=False):
    return {"kind": kind, "layer": layer, "message": message, "note": note}


def _merge(findings):
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


# === The layers and the trace ===


def layer_tree(model):
    """{path: layer} of every layer below `model`, depth first; paths like "block_0/attention"."""
    layers = {}

    def visit(layer, prefix):
        for child in children(layer):
            if isinstance(child, keras.layers.InputLayer):
                continue
            layers[prefix + child.name] = child
            visit(child, prefix + child.name + "/")

    visit(model, "")
    return layers


def _own_weights(layer):
    nested = {id(v) for child in children(layer) for v in child.weights}
    return [v for v in layer.weights if id(v) not in nested]


def _trace(model, inputs, loss_fn, targets):
    """Traces (does not run) a training-mode forward pass and the loss on its outputs."""
    inputs = _dummy(inputs if inputs is not None else _input_specs(model))
    targets = _dummy(targets) if loss_fn is not None else None

    @tf.function
    def forward(features, targets):
        outputs = model(features, training=True)
        if loss_fn is None:
            return outputs, ()
        with tf.name_scope(LOSS_SCOPE):
            return outputs, loss_fn(targets, outputs)

    concrete = forward.get_concrete_function(inputs, targets)
    outputs, losses = concrete.structured_outputs
    return concrete.graph, tf.nest.flatten(outputs), tf.nest.flatten(losses)


def _input_specs(model):
    try:
        symbolic = model.input
    except (AttributeError, ValueError):
        message = f"{model.name}: pass inputs= (tf.TensorSpecs): only a functional model knows its inputs"
        raise ValueError(message) from None
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), symbolic)


def _dummy(specs):
    return tf.nest.map_structure(lambda s: tf.TensorSpec([d or DUMMY_DIM for d in s.shape], s.dtype), specs)


def _locator(model, layers):
    """op name -> path of the deepest layer whose name scope the op ran in (the model's
    name for its own ops, "loss" for the loss's)."""
    by_parent = {}
    for path, layer in layers.items():
        by_parent.setdefault(path.rpartition("/")[0], []).append((layer.name, path))

    def locate(op_name):
        scopes = op_name.split("/")[:-1]
        if scopes and _scope_of(LOSS_SCOPE, scopes[0]):
            return LOSS_SCOPE
        if not scopes or not _scope_of(model.name, scopes[0]):
            return model.name
        path = ""
        for scope in scopes[1:]:
            # A name first, then a name with the `_N` suffix of a second call or trace.
            match = [p for name, p in by_parent.get(path, ()) if name == scope]
            match = match or [p for name, p in by_parent.get(path, ()) if _scope_of(name, scope)]
            if not match:
                break
            path = match[0]
        return path or model.name

    return locate


def _scope_of(name, scope):
    return scope == name or re.fullmatch(re.escape(name) + r"_\d+", scope) is not None


def _dtype(op):
    return op.outputs[0].dtype.name if op.outputs else None


# === The checks ===


def _float32_ops(graph, locate):
    """The arithmetic op types each layer runs in float32 in its own name scope."""
    found = {}
    for op in graph.get_operations():
        if op.type not in BOOKKEEPING and _dtype(op) == "float32" and not _local_upcast(op):
            found.setdefault(locate(op.name), set()).add(op.type)
    return found


def _local_upcast(op):
    """One op between casts from and back to half precision: an accumulation upcast inside
    a Keras op (ops.mean does this), not a layer computing in float32."""
    inputs = [t for t in op.inputs if t.dtype.is_floating]
    consumers = [c for t in op.outputs for c in t.consumers()]
    return bool(
        inputs
        and consumers
        and all(t.op.type == "Cast" and t.op.inputs[0].dtype.name in HALF for t in inputs)
        and all(c.type == "Cast" and _dtype(c) in HALF for c in consumers)
    )


def _op_findings(graph, locate):
    """Softmax, exp, layer-norm and loss arithmetic in half precision, one finding a layer."""
    groups = {}
    for op in graph.get_operations():
        dtype, layer = _dtype(op), locate(op.name)
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


def _constant_findings(graph, locate):
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


def _output_findings(outputs, losses, locate):
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


def _policy_findings(layers, float32_ops, compute, policy):
    """Layers that compute in another dtype than the policy's without declaring why, or
    keep variables that are not float32."""
    findings = []
    declare = "without declaring a float32 island (amptrain.models.islands)"
    for path, layer in layers.items():
        reason = island_reason(layer)
        # A nested model only routes tensors: its own dtype policy is not a computation.
        dtype = compute if isinstance(layer, keras.Model) else layer.compute_dtype
        if dtype != compute and not (dtype == "float32" and reason):
            message = f"computes in {dtype} under {policy}" + (f" {declare}" if dtype == "float32" else "")
            findings.append(_finding("ignored_policy", path, message))
        elif float32_ops.get(path) and not reason:
            ops = ", ".join(sorted(float32_ops[path]))
            findings.append(_finding("ignored_policy", path, f"runs {ops} in float32 under {policy} {declare}"))
        odd = sorted({v.dtype for v in _own_weights(layer)} - {"float32"})
        if odd:
            message = f"keeps variables in {', '.join(odd)}: updates smaller than their precision are lost"
            findings.append(_finding("ignored_policy", path, message))
    return findings


def _loss_scale_findings(compute, scaling):
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


def _size_findings(layers, sizes, compute):
    """Dimensions that are not multiples of 8: half-precision matmuls on tensor cores (and
    XLA's tiles) want them. Notes under float32, where they would matter after a switch."""
    used = {}
    for path, layer in layers.items():
        # What computes in half precision, or would under a mixed policy (not the islands).
        if layer.compute_dtype != "float32" or (compute == "float32" and not island_reason(layer)):
            for variable in _own_weights(layer):
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


def _rows(layers, float32_ops):
    return [
        {
            "path": path,
            "class": type(layer).__name__,
            "compute_dtype": layer.compute_dtype,
            "variable_dtype": ", ".join(sorted({v.dtype for v in layer.weights})) or "-",
            "island": island_reason(layer) is not None,
            "reason": island_reason(layer) or "",
            "float32_ops": sorted(float32_ops.get(path, ())),
        }
        for path, layer in layers.items()
    ]


# === Text ===


def format_report(report):
    """The report as text: a header line, the per-layer table, the risks and the notes."""
    reason = f" ({report['policy_reason']})" if report.get("policy_reason") else ""
    lines = [
        f"{report['model']} under {report['policy']}{reason}: compute {report['compute_dtype']}, "
        f"loss scaling {report['loss_scale']}",
        "",
    ]
    table = [("layer", "class", "compute", "variables", "float32 island")]
    for row in report["rows"]:
        island = f"yes: {row['reason']}" if row["island"] else "-"
        table.append((row["path"], row["class"], row["compute_dtype"], row["variable_dtype"], island))
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[4] for line in table]
    lines.append("")
    lines += _format_findings("risks", report["risks"])
    if report["notes"]:
        lines += _format_findings("notes", report["notes"])
    return "\n".join(lines)


def _format_findings(title, findings):
    if not findings:
        return [f"{title}: none"]
    return [f"{title} ({len(findings)}):"] + [
        f"  [{f['kind']}] " + (f"{f['layer']}: " if f["layer"] else "") + f["message"] for f in findings
    ]
