"""`amptrain bench CONFIG`: its arguments, the grid, the run, the table, `--max-batch`.

    amptrain bench configs/classify-spam.toml --steps 30 --repeats 3
    amptrain bench configs/classify-spam.toml --precisions float32,mixed_bfloat16 --jit on \\
        --steps-per-execution 8 --max-batch --memory-limit 6GiB
"""

import os

from amptrain.commands.options import add_set_option
from amptrain.errors import UserError

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def _items(option, text, convert):
    values = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            values.append(convert(item))
        except ValueError:
            raise UserError(f"{option}: cannot read {item!r} in {text!r}") from None
    if not values:
        raise UserError(f"{option}: expected a comma-separated list, received {text!r}")
    return tuple(values)


def _precision(item):
    if item not in POLICIES:
        raise ValueError(item)
    return item


def _switch(item):
    if item not in ("on", "off", "fusible"):
        raise ValueError(item)
    return "fusible" if item == "fusible" else item == "on"


def _positive(item):
    value = int(item)
    if value < 1:
        raise ValueError(item)
    return value


def grid_from_args(args):
    from amptrain.bench.runner import Grid

    return Grid(
        precisions=_items("--precisions", args.precisions, _precision),
        jit=_items("--jit", args.jit, _switch),
        steps_per_execution=_items("--steps-per-execution", args.steps_per_execution, _positive),
        batch_sizes=_items("--batch-sizes", args.batch_sizes, _positive) if args.batch_sizes else (None,),
    )


def add(commands):
    bench = commands.add_parser(
        "bench", help="time training per precision, XLA and steps per execution; MFU, memory, speed-ups"
    )
    bench.add_argument("config", help="a TOML config, e.g. configs/classify-spam.toml")
    add_set_option(bench)
    bench.add_argument("--precisions", default="float32,mixed_bfloat16,mixed_float16", help="comma-separated policies")
    bench.add_argument(
        "--jit", default="off,on", help='XLA settings to try: off,on,fusible (jit_compile false, true, "fusible")'
    )
    bench.add_argument("--steps-per-execution", default="1,20", help="comma-separated integers")
    bench.add_argument("--batch-sizes", default="", help="comma-separated global batch sizes (default: the config's)")
    bench.add_argument("--steps", type=int, default=30, help="timed steps a repeat (default 30)")
    bench.add_argument("--repeats", type=int, default=3, help="timed repeats a combination (default 3)")
    bench.add_argument(
        "--data",
        choices=("real", "synthetic"),
        default="real",
        help="real: the task's input pipeline; synthetic: one real batch of the longest bucket, from memory",
    )
    bench.add_argument("--run-dir", help="results go to RUN_DIR/bench (default: runs/<config name>)")
    bench.add_argument(
        "--max-batch",
        action="store_true",
        help="also find the largest batch that fits, per precision (doubling, then bisection)",
    )
    bench.add_argument("--memory-limit", help="for --max-batch on a CPU: the peak resident memory allowed, e.g. 8GiB")
    bench.set_defaults(run=run)


def run(args):
    from amptrain import config as config_lib
    from amptrain.bench import report
    from amptrain.bench.memory_plan import parse_memory
    from amptrain.bench.runner import refuse_batch_sizes, run_bench

    grid = grid_from_args(args)
    if args.max_batch:  # before the grid is measured, not after
        refuse_batch_sizes(config_lib.load_config(args.config, args.overrides), "--max-batch")
    memory_limit = parse_memory(args.memory_limit) if args.memory_limit else None
    run_dir = args.run_dir or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    out_dir = os.path.abspath(os.path.join(run_dir, "bench"))
    results = run_bench(args.config, args.overrides, grid, args.steps, args.repeats, args.data, out_dir)
    if args.max_batch:
        results["max_batch"] = {
            precision: _max_batch(args, grid, precision, memory_limit, results["rows"]) for precision in grid.precisions
        }
        report.write_all(results, out_dir)
    print(report.format_table(results["rows"]))
    for precision, found in results.get("max_batch", {}).items():
        print(f"largest batch that fits, {precision}: {found['largest']}")
    variables = report.variables_line(results["rows"])
    if variables:
        print(variables)
    print(f"peak: {results['peak_flops'] / 1e9:,.1f} GFLOP/s ({results['peak_source']})")
    if results.get("auto_choice"):
        print(results["auto_choice"])
    print(f"results in {out_dir}: results.json, report.md, " + ", ".join(_plots(out_dir)))
    return 0


def _max_batch(args, grid, precision, memory_limit, rows):
    """The largest batch of `precision` that fits: estimated from the model first
    (`bench/memory_plan.py`, in a worker), then found by measured steps from there."""
    from amptrain.bench.memory_plan import total_at
    from amptrain.bench.runner import find_max_batch, run_worker

    spec = {"kind": "estimate", "config": args.config, "overrides": list(args.overrides), "precision": precision}
    estimate = run_worker({**spec, "budget": memory_limit})
    guess = estimate.get("largest_batch") if memory_limit else None
    print(
        f"  {precision}: estimated {estimate['activations_bytes_per_row'] / 2**20:.2f} MiB a row"
        + (f", largest batch {guess}" if guess else "")
    )
    start = guess or max(r["batch_size"] for r in rows)
    largest, tried = find_max_batch(
        args.config,
        args.overrides,
        precision,
        grid.jit[-1],
        grid.steps_per_execution[-1],
        memory_limit,
        start,
        growth=1.125 if guess else 2.0,
    )
    return {
        "largest": largest,
        "tried": tried,
        "memory_limit_bytes": memory_limit,
        "estimate": estimate,
        "estimated_bytes": {batch: total_at(estimate, batch) for batch in tried},
    }


def _plots(out_dir):
    return sorted(name for name in os.listdir(out_dir) if name.endswith(".png"))
