"""`amptrain export RUN`: a SavedModel that takes raw text (TF Serving's layout), or the token-ids
graph as ONNX; prints where it went as one JSON object."""

import json

from amptrain.commands.options import add_set_option, add_trust_option


def add(commands):
    export = commands.add_parser(
        "export",
        help="a run as a SavedModel that takes raw text (TF Serving's layout), its token-ids graph as ONNX, "
        "or a fine-tuned pretrained language model as a transformers folder",
    )
    export.add_argument("run_dir")
    export.add_argument(
        "--out",
        help="the export folder; the model goes to OUT/VERSION (default: RUN_DIR/export, RUN_DIR/export-onnx for "
        "onnx), a transformers folder or GGUF file to OUT itself (default RUN_DIR/export-transformers, -gguf)",
    )
    export.add_argument(
        "--format", dest="fmt", default="saved_model", help="saved_model (default), onnx, transformers or gguf"
    )
    export.add_argument("--checkpoint", default="best", help="best (default: by the dev metric) or latest")
    export.add_argument("--version", default="1", help="the version folder's number (default 1)")
    export.add_argument("--overwrite", action="store_true", help="replace an existing version folder")
    export.add_argument(
        "--precision",
        default="float32",
        help="float32 (default), bfloat16 or float16: half-precision compute, float32 islands and weights kept; "
        "with --format transformers, the weights' dtype",
    )
    export.add_argument(
        "--quantize", help="with --format gguf: f32 (default), f16, bf16, q8_0 or q4_0, the matrices' type"
    )
    add_set_option(export, "override a value of the run's config, e.g. decode.beam_size=4 (repeatable)")
    add_trust_option(export)
    export.set_defaults(run=run)


def run(args):
    """`api.export` with the options under its own parameter names."""
    from amptrain import api
    from amptrain.errors import UserError

    if not args.version.isdigit():
        raise UserError(f"--version {args.version}: expected a whole number >= 0 (TF Serving's version folder)")
    names = ("out", "fmt", "checkpoint", "overwrite", "precision", "overrides", "trust_run_code", "quantize")
    result = api.export(args.run_dir, version=int(args.version), **{name: getattr(args, name) for name in names})
    print(json.dumps(result))
    return 0
