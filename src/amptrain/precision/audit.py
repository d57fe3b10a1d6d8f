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
- `fp16_reduction`: a sum or mean of 256 elements or more in float16;
- `fp16_into_island`: arithmetic in float16 inside a float32 island (a float16 input not cast);
- `ignored_policy`: a layer computing in another dtype than the policy's without declaring
  a float32 island (`amptrain.models.islands`), or keeping variables that are not float32;
- `no_loss_scale`: float16 without loss scaling;
- `size_alignment`: a matrix dimension, or a size of the config, not a multiple of 8.

The same findings in bfloat16 (float32's range, 8 bits of precision) and misaligned sizes
under float32 are notes, not risks.

The trace and the op-to-layer map are in `precision/audit_trace.py`, the checks in
`precision/audit_checks.py`; this module runs them and formats the report.
"""

import keras

from amptrain.precision.audit_checks import (
    constant_findings,
    float32_op_types,
    island_input_findings,
    island_reasons,
    loss_scale_findings,
    merge,
    op_findings,
    output_findings,
    policy_findings,
    reduction_findings,
    size_findings,
)
from amptrain.precision.audit_trace import HALF, layer_tree, locator, trace


def audit_model(
    model, policy, loss_scale="auto", inputs=None, loss_fn=None, targets=None, sizes=None, built_under_policy=False
):
    """Audits `model`, built under `policy` (a Keras dtype policy name); returns plain data:
    {"model", "policy", "compute_dtype", "loss_scale", "rows", "risks", "notes"}. A row a
    layer: path, class, compute_dtype, variable_dtype, island, reason, and float32_ops (the
    op types the layer itself runs in float32, under a mixed policy). A risk or note:
    kind, layer (a path, "loss", or None for the config), message.

    `inputs`: tf.TensorSpecs shaped like the model's input (default: a functional model's
    inputs); unknown dimensions become 8. `loss_fn(targets, outputs)` with `targets`
    (TensorSpecs) adds the loss to the trace. `loss_scale`: `precision.loss_scale`.
    `sizes`: named sizes to check for tensor-core alignment, e.g. {"model.hidden_dim": 64}.
    `built_under_policy`: the model was built with `policy` the global one (a user's model,
    `precision/audit_keras.py`), so a layer in float32 was declared so by its constructor.
    """
    compute = keras.DTypePolicy(policy).compute_dtype
    layers = layer_tree(model)
    graph, outputs, losses = trace(model, inputs, loss_fn, targets, layers)
    locate = locator(model, layers)
    reasons = island_reasons(layers, compute, built_under_policy)
    float32_ops = float32_op_types(graph, locate) if compute in HALF else {}
    scaling = loss_scaling(compute, loss_scale)
    findings = (
        op_findings(graph, locate)
        + reduction_findings(graph, locate)
        + island_input_findings(graph, locate, layers, reasons)
        + constant_findings(graph, locate)
        + output_findings(outputs, losses, locate)
        + policy_findings(layers, float32_ops, compute, policy, reasons)
        + loss_scale_findings(compute, scaling)
        + size_findings(layers, sizes or {}, compute, reasons)
    )
    risks, notes = [], []
    for finding in merge(findings):
        (notes if finding.pop("note") else risks).append(finding)
    return {
        "model": model.name,
        "policy": policy,
        "compute_dtype": compute,
        "loss_scale": scaling,
        "rows": _rows(layers, float32_ops, reasons),
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


def _rows(layers, float32_ops, reasons):
    return [
        {
            "path": path,
            "class": type(layer).__name__,
            "compute_dtype": layer.compute_dtype,
            "variable_dtype": ", ".join(sorted({v.dtype for v in layer.weights})) or "-",
            "island": reasons[path] is not None,
            "reason": reasons[path] or "",
            "float32_ops": sorted(float32_ops.get(path, ())),
        }
        for path, layer in layers.items()
    ]


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
