"""`amptrain audit CONFIG`: each layer's compute and variable dtype, the float32 islands and the
precision risks; exit status 1 when there are risks."""

import json

from amptrain.commands.options import add_set_option


def add(commands):
    audit = commands.add_parser(
        "audit",
        help="print each layer's compute and variable dtype, the float32 islands and the precision risks",
        description="Build the config's model under its precision policy and print, per layer, the compute "
        "dtype, the variable dtype and whether it is a float32 island and why; then the precision risks. "
        "Exit status: 0 no risk, 1 risks found, 2 a config or data error.",
    )
    audit.add_argument("config", help="a TOML config, e.g. configs/classify-spam.toml")
    add_set_option(audit, "override a config value (repeatable), e.g. precision.policy=mixed_float16")
    audit.add_argument("--json", action="store_true", help="print the report as one JSON object")
    audit.set_defaults(run=run)


def run(args):
    from amptrain import api

    report = api.audit(args.config, args.overrides)  # a config error is reported before TensorFlow loads
    from amptrain.precision.audit import format_report

    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["risks"] else 0
