"""The `amptrain` command: fit, eval, predict, audit, launch, bench. Thin: the work is in `amptrain.api`.

amptrain fit configs/classify-spam.toml --set train.steps=200
amptrain eval runs/classify-spam --split test
amptrain predict runs/classify-spam --text "see you at lunch"
amptrain export runs/classify-spam [--format onnx] [--precision bfloat16]   # runs/classify-spam/export/1
amptrain predict runs/classify-spam/export --text "see you at lunch"          # the export answers
amptrain audit configs/classify-spam.toml --set precision.policy=mixed_float16 [--json]
amptrain launch --workers 2 configs/classify-spam.toml   # a multi-worker run on this machine
amptrain doctor [--json]                                  # the hardware, the `auto` policy, the peaks
amptrain doctor --memory configs/classify-spam.toml --memory-limit 4GiB   # what fits, before training
amptrain --verbose COMMAND ...   # TensorFlow's own logs too (or AMPTRAIN_TF_LOGS=1); `amptrain --version`
"""

import argparse
import json
import os
import sys

from amptrain.serving.cli import add_serve


def main(argv=None):
    from amptrain.errors import not_utf8

    if bad := not_utf8(sys.argv[1:] if argv is None else argv):  # one line, not a traceback
        print(bad, file=sys.stderr)
        return 2
    parser = _parser()
    args = parser.parse_args(argv)
    from amptrain import tf_logs

    if args.verbose:
        os.environ[tf_logs.VERBOSE_ENV] = "1"  # the workers of launch and bench inherit it
    if argv is None:  # a program (the `amptrain` command, python -m amptrain), not a caller's process
        tf_logs.quiet()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if tf_logs.verbose() else "1")
    from amptrain.errors import Interrupted, NumericsError, PeerLost, UserError

    try:
        return args.run(args)
    except UserError as error:
        print(f"amptrain: error: {error}", file=sys.stderr)
        return 2
    except NumericsError as error:
        print(f"amptrain: training stopped: {error}", file=sys.stderr)
        return 3
    except PeerLost as error:
        print(f"amptrain: training stopped: {error}", file=sys.stderr)
        return 4
    except Interrupted:
        print("amptrain: stopped by SIGTERM after saving a checkpoint; rerun to resume", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("amptrain: interrupted", file=sys.stderr)
        return 130


def _parser():
    import amptrain

    parser = argparse.ArgumentParser(prog="amptrain", description="Train Transformers in mixed precision.")
    parser.add_argument("--version", action="version", version=_version(amptrain.__version__))
    parser.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for add in (
        _add_fit,
        _add_eval,
        _add_predict,
        _add_export,
        _add_audit,
        _add_launch,
        _add_bench,
        _add_doctor,
        add_serve,
    ):
        add(commands)
    for command in commands.choices.values():  # `amptrain fit --verbose ...` too
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return parser


_VERBOSE_HELP = "show TensorFlow's own start-up and INFO logs (also: AMPTRAIN_TF_LOGS=1)"


def _version(version):
    """`amptrain 0.1.0 (TensorFlow 2.21.0, Keras 3.15.1, Python 3.11.9)`, without importing TensorFlow."""
    from importlib import metadata

    tensorflow, keras = (metadata.version(name) for name in ("tensorflow", "keras"))
    return f"amptrain {version} (TensorFlow {tensorflow}, Keras {keras}, Python {sys.version.split()[0]})"


def _add_fit(commands):
    fit = commands.add_parser("fit", help="train (or resume) a run, then score its test split")
    _add_run_options(fit)
    fit.set_defaults(run=_fit)


def _add_eval(commands):
    evaluate = commands.add_parser("eval", help="score a split with a run's best checkpoint")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--split", default="test", choices=("dev", "test"))
    evaluate.add_argument("--data", help="score this labelled file instead of a split of the config")
    _add_trust_option(evaluate)
    evaluate.set_defaults(run=_eval)


def _add_trust_option(command):
    command.add_argument(
        "--trust-run-code",
        action="store_true",
        help="import the task module the run's config names even if you never ran `fit` with that file here "
        "(a run folder's config names code; without this, only code you trained with runs)",
    )


def _add_predict(commands):
    predict = commands.add_parser(
        "predict",
        help="label, tag or translate texts with a run's best checkpoint (JSON lines out; "
        "translation: one translated line a line)",
    )
    predict.add_argument("run_dir", help="a run folder, an export folder, or a pretrained language model's")
    source = predict.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", action="append", help="a text (repeatable)")
    source.add_argument("--input", help="a file of texts, one a line")
    predict.add_argument(
        "--json",
        action="store_true",
        help="translation: JSON lines ({text, translation}) instead of the translated text alone",
    )
    generating = predict.add_argument_group(
        "language models: how to continue the prompt (default: the run's [generate])"
    )
    generating.add_argument("--max-new-tokens", type=int, help="pieces to add at most (default 64)")
    generating.add_argument("--temperature", type=float, help="0: greedy (the default); > 0: sample")
    generating.add_argument("--top-k", type=int, help="sample among the k most likely pieces (0: all)")
    generating.add_argument("--top-p", type=float, help="sample among the most likely pieces that sum to p")
    generating.add_argument("--seed", type=int, help="the sampling's seed: the same seed, the same text")
    generating.add_argument("--precision", help="a pretrained folder's: float32 (default), bfloat16, float16")
    _add_trust_option(predict)
    predict.set_defaults(run=_predict)


def _add_export(commands):
    export = commands.add_parser(
        "export",
        help="a run as a SavedModel that takes raw text (TF Serving's layout), or its token-ids graph as ONNX",
    )
    export.add_argument("run_dir")
    export.add_argument(
        "--out",
        help="the export folder; the model goes to OUT/VERSION (default: RUN_DIR/export, RUN_DIR/export-onnx for onnx)",
    )
    export.add_argument("--format", default="saved_model", help="saved_model (default) or onnx")
    export.add_argument("--checkpoint", default="best", help="best (default: by the dev metric) or latest")
    export.add_argument("--version", default="1", help="the version folder's number (default 1)")
    export.add_argument("--overwrite", action="store_true", help="replace an existing version folder")
    export.add_argument(
        "--precision",
        default="float32",
        help="float32 (default), bfloat16 or float16: half-precision compute, float32 islands and weights kept",
    )
    export.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of the run's config, e.g. decode.beam_size=4 (repeatable)",
    )
    _add_trust_option(export)
    export.set_defaults(run=_export)


def _add_audit(commands):
    audit = commands.add_parser(
        "audit",
        help="print each layer's compute and variable dtype, the float32 islands and the precision risks",
        description="Build the config's model under its precision policy and print, per layer, the compute "
        "dtype, the variable dtype and whether it is a float32 island and why; then the precision risks. "
        "Exit status: 0 no risk, 1 risks found, 2 a config or data error.",
    )
    audit.add_argument("config", help="a TOML config, e.g. configs/classify-spam.toml")
    audit.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), e.g. precision.policy=mixed_float16",
    )
    audit.add_argument("--json", action="store_true", help="print the report as one JSON object")
    audit.set_defaults(run=_audit)


def _add_launch(commands):
    launch = commands.add_parser(
        "launch",
        help="a multi-worker run on this machine: N `fit` processes over localhost (worker 0 writes the run folder)",
    )
    launch.add_argument("--workers", type=int, required=True, help="how many worker processes (2 or more)")
    _add_run_options(launch)  # the same as fit's: each worker runs `fit` with them
    launch.set_defaults(run=_launch)


def _add_bench(commands):
    bench = commands.add_parser(
        "bench", help="time training per precision, XLA and steps per execution; MFU, memory, speed-ups"
    )
    bench.add_argument("config", help="a TOML config, e.g. configs/classify-spam.toml")
    bench.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable)",
    )
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
    bench.set_defaults(run=_bench)


def _add_doctor(commands):
    doctor = commands.add_parser(
        "doctor",
        help="versions, devices, XLA, TF32, the policy `auto` would choose and why, matrix-product peaks",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doctor.add_argument("--no-peaks", action="store_true", help="skip the matrix-product peaks (2 s a dtype)")
    doctor.add_argument("--remeasure", action="store_true", help="measure the peaks again instead of the cache")
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
    doctor.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of the --probe or --memory config (repeatable)",
    )
    doctor.set_defaults(run=_doctor)


def _add_run_options(command):
    """The options of a command that trains a config into a run folder (fit, launch)."""
    command.add_argument("config", help="a TOML config, e.g. configs/classify-spam.toml")
    command.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable); the value is read as TOML, else as a string",
    )
    command.add_argument("--run-dir", help="run folder (default: runs/<config name>)")
    command.add_argument("--overwrite", action="store_true", help="delete the run folder and start afresh")


def _fit(args):
    from amptrain import api

    api.fit(args.config, args.overrides, run_dir=args.run_dir, overwrite=args.overwrite)
    return 0


def _eval(args):
    from amptrain import api

    print(json.dumps(api.evaluate(args.run_dir, split=args.split, data=args.data, trust_run_code=args.trust_run_code)))
    return 0


def _predict(args):
    from amptrain import api

    if args.input:  # streamed: each chunk's records as soon as they are computed
        from amptrain.serving.streaming import predict_lines, read_text_lines

        lines = read_text_lines(args.input)
        records = predict_lines(
            args.run_dir, lines, api.load_run, trust=args.trust_run_code, overrides=_generating(args),
            precision=args.precision,
        )  # fmt: skip
    else:
        records = api.predict(
            args.run_dir, args.text, trust_run_code=args.trust_run_code, overrides=_generating(args),
            precision=args.precision,
        )  # fmt: skip
    for record in records:
        if "translation" in record and not args.json:
            print(record["translation"], flush=bool(args.input))  # line i out for line i in
        elif "generated" in record and not args.json:
            print(record["generated"], flush=bool(args.input))  # the continuation, as text
        else:
            print(json.dumps(record, ensure_ascii=False), flush=bool(args.input))
    return 0


def _generating(args):
    """`--temperature 0.8` and the like as overrides of the run's `[generate]` section."""
    names = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")
    return [(f"generate.{name}", getattr(args, name)) for name in names if getattr(args, name) is not None]


def _export(args):
    from amptrain import api
    from amptrain.errors import UserError

    if not args.version.isdigit():
        raise UserError(f"--version {args.version}: expected a whole number >= 0 (TF Serving's version folder)")
    result = api.export(
        args.run_dir,
        out=args.out,
        fmt=args.format,
        checkpoint=args.checkpoint,
        version=int(args.version),
        overwrite=args.overwrite,
        precision=args.precision,
        overrides=args.overrides,
        trust_run_code=args.trust_run_code,
    )
    print(json.dumps(result))
    return 0


def _audit(args):
    from amptrain import api

    report = api.audit(args.config, args.overrides)  # a config error is reported before TensorFlow loads
    from amptrain.precision.audit import format_report

    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["risks"] else 0


def _launch(args):
    from amptrain.launch import launch

    # Each worker runs this command's main, forked after the import where it can be (launch.py).
    return launch(args.config, args.workers, args.overrides, run_dir=args.run_dir, overwrite=args.overwrite, main=main)


def _doctor(args):
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


def _bench(args):
    from amptrain.bench.cli import bench

    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
