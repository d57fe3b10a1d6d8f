"""What `amptrain bench` writes: a terminal table, `results.json`, `report.md` and PNG plots.

print(format_table(results["rows"]))
write_all(results, "runs/classify-spam/bench")
"""

import json
import os
import platform

from amptrain import xla_modes

COLUMNS = (
    ("precision", "precision", "{}"),
    ("jit", "XLA", "{}"),
    ("steps_per_execution", "spe", "{}"),
    ("batch_size", "batch", "{}"),
    ("num_replicas", "replicas", "{}"),
    ("real_tokens_per_second", "real tok/s", "{:,.0f}"),
    ("padded_tokens_per_second", "padded tok/s", "{:,.0f}"),
    ("examples_per_second", "examples/s", "{:,.1f}"),
    ("step_time_p50", "step p50 ms", "{:.1f}"),
    ("step_time_p10", "p10", "{:.1f}"),
    ("step_time_p90", "p90", "{:.1f}"),
    ("compile_seconds", "compile s", "{:.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("mfu_padded", "MFU padded", "{:.1%}"),
    ("peak_memory_bytes", "peak MiB", "{:,.0f}"),
    ("speedup", "speed-up", "{:.2f}x"),
)
_MILLISECONDS = ("step_time_p50", "step_time_p10", "step_time_p90")


def _cell(row, key, form):
    if key == "batch_size" and row.get("tokens_per_batch"):
        return batch_label(row)
    value = row.get(key)
    if value is None:
        return "-"
    if key in _MILLISECONDS:
        value *= 1e3
    if key == "peak_memory_bytes":
        value /= 2**20
    if key == "jit":
        return xla_modes.describe(value)
    return form.format(value)


def batch_label(row):
    """The batch column: its rows, or its token budget under `data.tokens_per_batch`
    (whose rows vary by bucket; `examples/s` counts them)."""
    return f"{row['tokens_per_batch']} tok" if row.get("tokens_per_batch") else str(row["batch_size"])


def format_table(rows, markdown=False):
    header = [title for _, title, _ in COLUMNS]
    cells = [[_cell(row, key, form) for key, _, form in COLUMNS] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    return "\n".join(lines + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells])


def mfu_unknown(rows):
    """The sentence saying why MFU is "-" (unknown) in the table, or "" when it is known: the
    model's FLOPs cannot be counted (`hardware/flops.py`), and the layers that stop it."""
    unknown = [row for row in rows if row.get("flops_per_token") is None]
    if not unknown:
        return ""
    uncounted = unknown[0].get("uncounted_layers") or []
    layers = "; ".join(uncounted[:3]) + (f"; and {len(uncounted) - 3} more" if len(uncounted) > 3 else "")
    return "MFU unknown (-): the model's FLOPs cannot be counted" + (f" ({layers})." if layers else ".")


def environment():
    import keras
    import tensorflow as tf

    from amptrain.precision.policy import cpu_flags_from_proc, cpu_model_name, describe_devices

    flags = cpu_flags_from_proc()
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpu": cpu_model_name() or platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "cpu_flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "fma"}),
        "accelerators": describe_devices(),
    }


def write_all(results, out_dir):
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    plots = write_plots(results["rows"], out_dir)
    if results.get("max_batch"):
        write_memory_plot(results["max_batch"], out_dir, results["rows"])
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(markdown_report(results, plots))


def variables_line(rows):
    """The parameters, the share trained and the bytes of weights, gradients and optimizer
    slots of the first row (the same model in every row; LoRA trains a share of it)."""
    first = next((r for r in rows if r.get("parameters")), None)
    if first is None:
        return ""
    mib = {key: first[key] / 2**20 for key in ("weights_bytes", "gradients_bytes", "optimizer_slots_bytes")}
    return (
        f"parameters: {first['parameters']:,}, {first['trainable_parameters']:,} trained "
        f"({100 * first['trainable_parameters'] / first['parameters']:.1f}%); weights {mib['weights_bytes']:,.1f} MiB, "
        f"gradients {mib['gradients_bytes']:,.1f} MiB, optimizer slots {mib['optimizer_slots_bytes']:,.1f} MiB"
    )


def markdown_report(results, plots):
    env = results["environment"]
    peaks = "\n".join(f"- {p}: {v['flops'] / 1e9:,.1f} GFLOP/s ({v['source']})" for p, v in results["peaks"].items())
    accelerators = ", ".join(d.get("device_name") or d["name"] for d in env["accelerators"]) or "none"
    lines = [
        "# amptrain bench",
        "",
        f"Config `{results['config']}`"
        + (f" with `{' '.join(results['overrides'])}`" if results["overrides"] else "")
        + f"; {results['steps']} steps × {results['repeats']} repeats a combination, data: {results['data']}, "
        + results.get("isolation", "each combination in its own process")
        + " (compile timed apart).",
        "",
        "## Hardware and versions",
        "",
        f"- CPU: {env['cpu']}, {env['cpu_count']} logical cores, flags {', '.join(env['cpu_flags']) or 'none'}",
        f"- accelerators: {accelerators}",
        f"- {env['platform']}, Python {env['python']}, TensorFlow {env['tensorflow']}, Keras {env['keras']}",
        "",
        "## Peaks (MFU is measured against the peak of each row's precision)",
        "",
        peaks,
        "",
        "## Results",
        "",
        "MFU counts real tokens; `MFU padded` counts padded ones. Speed-up: real tokens/s against the "
        "float32 / XLA off / spe 1 row of the same batch size. Peak memory: "
        + (results["rows"][0]["peak_memory_source"] if results["rows"] else "-")
        + ".",
        "",
        format_table(results["rows"], markdown=True),
        "",
        variables_line(results["rows"]),
        "",
    ]
    unknown = mfu_unknown(results["rows"])
    if unknown:
        lines += [unknown, ""]
    if results.get("auto_choice"):
        lines += [results["auto_choice"] + ".", ""]
    lines += [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def write_plots(rows, out_dir):
    """Throughput and peak memory per combination, as PNG files; returns their names."""
    import matplotlib

    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    labels = [
        f"{r['precision'].replace('mixed_', '')}\nXLA {xla_modes.describe(r['jit'])}\nspe {r['steps_per_execution']}"
        f"\nbatch {batch_label(r)}"
        for r in rows
    ]
    charts = (
        ("throughput.png", "real tokens/s", [r["real_tokens_per_second"] for r in rows]),
        ("memory.png", "peak memory (MiB)", [(r["peak_memory_bytes"] or 0) / 2**20 for r in rows]),
    )
    for name, title, values in charts:
        figure, axes = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
        axes.bar(range(len(rows)), values, color="#4c72b0")
        axes.set_xticks(range(len(rows)), labels, fontsize=7)
        axes.set_ylabel(title)
        axes.set_title(title + " per combination")
        figure.tight_layout()
        figure.savefig(os.path.join(out_dir, name), dpi=100)
        plt.close(figure)
    return [name for name, _, _ in charts]


def write_memory_plot(max_batch, out_dir, rows=(), name="memory.png"):
    """Peak memory against batch size after `--max-batch`: a precision's measured trials as
    points, its estimate (`bench/memory_plan.py`) as a line, its largest batch marked, and
    the budget across; replaces the per-combination bars of `write_plots`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from amptrain.bench.memory_plan import total_at

    figure, axes = plt.subplots(figsize=(8, 5))
    budget = None
    for index, (precision, found) in enumerate(max_batch.items()):
        color = f"C{index}"
        estimate = found.get("estimate") or {}
        label = precision.strip() + (f", remat {estimate['remat']}" if estimate.get("remat", "none") != "none" else "")
        measured = [(int(b), peak / 2**20) for b, peak in found["tried"].items() if peak]
        measured += [
            (r["batch_size"], r["peak_memory_bytes"] / 2**20)
            for r in rows
            if r["precision"] == precision and r.get("peak_memory_bytes") and not r.get("tokens_per_batch")
        ]
        measured.sort()
        if measured:
            axes.plot(*zip(*measured), "o", color=color, label=f"{label}: measured peak")
        if estimate:
            top = max([int(b) for b in found["tried"]] + [found.get("largest") or 0, 8]) * 1.1
            line = [(b, total_at(estimate, b) / 2**20) for b in (0, top)]
            axes.plot(*zip(*line), "--", color=color, label=f"{label}: estimate")
        if found.get("largest"):
            axes.axvline(found["largest"], color=color, linewidth=0.8, alpha=0.5)
        budget = found.get("memory_limit_bytes") or budget
    if budget:
        axes.axhline(budget / 2**20, color="black", linewidth=1, label=f"budget {budget / 2**30:.2f} GiB")
    axes.set_xlabel("batch size (rows)")
    axes.set_ylabel("peak memory (MiB)")
    axes.set_title("peak memory against batch size (vertical lines: the largest batch that fits)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, name), dpi=100)
    plt.close(figure)
    return name
