"""`amptrain doctor`: versions, devices, XLA, TF32, the policy `auto` would choose and why, the
matrix-product peaks; `--memory CONFIG`: what a config's training needs, before it trains."""

import json

from amptrain.commands.options import add_set_option


def add(commands):
    doctor = commands.add_parser(
        "doctor",
        help="versions, devices, XLA, TF32, the policy `auto` would choose and why, matrix-product peaks",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doctor.add_argument("--no-peaks", action="store_true", help="skip the matrix-product peaks (2 s a dtype)")
    doctor.add_argument(
        "--remeasure",
        action="store_true",
        help="measure the peaks again (the cache keeps the best of every measurement)",
    )
    doctor.add_argument(
        "--probe",
        metavar="CONFIG",
        help="also run the `auto` measurement (each candidate's tokens/s) on this config's model, e.g. a small one",
    )
    doctor.add_argument(
        "--memory",
        metavar="CONFIG",
        help="estimate what this config's training needs in memory a precision, from its model, before it trains",
    )
    doctor.add_argument(
        "--memory-limit", help="with --memory: the largest batch under this budget, e.g. 4GiB (a CPU's RSS)"
    )
    add_set_option(doctor, "override a value of the --probe or --memory config (repeatable)")
    doctor.set_defaults(run=run)


def run(args):
    from amptrain import doctor

    if args.memory:
        from amptrain.bench.memory_plan import doctor_memory

        return doctor_memory(args.memory, args.overrides, args.memory_limit, args.json)
    report = doctor.diagnose(measure_peaks=not args.no_peaks, refresh=args.remeasure)
    if args.probe:
        report["probe"] = doctor.probe_config(args.probe, args.overrides)
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    if not args.json and report["peaks"]:
        print(doctor.cache_note())
    return 0
