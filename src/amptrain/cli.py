"""The `amptrain` command: the dispatcher of its subcommands (`amptrain/commands/`, a module
each: its arguments, the call, the printing); the work is in `amptrain.api` and below.

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
import os
import sys

from amptrain.commands import audit, bench, doctor, evaluate, export, fit, launch, predict, serve

COMMANDS = (fit, evaluate, predict, export, audit, launch, bench, doctor, serve)  # each: add(), run()


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
    parser.set_defaults(main=main)  # `launch` runs it in each worker
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add(commands)
    for command in commands.choices.values():  # `amptrain fit --verbose ...` too
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return parser


_VERBOSE_HELP = "show TensorFlow's own start-up and INFO logs (also: AMPTRAIN_TF_LOGS=1)"


def _version(version):
    """`amptrain 0.1.0 (TensorFlow 2.21.0, Keras 3.15.1, Python 3.11.9)`, without importing TensorFlow."""
    from importlib import metadata

    tensorflow, keras = (metadata.version(name) for name in ("tensorflow", "keras"))
    return f"amptrain {version} (TensorFlow {tensorflow}, Keras {keras}, Python {sys.version.split()[0]})"


if __name__ == "__main__":
    sys.exit(main())
