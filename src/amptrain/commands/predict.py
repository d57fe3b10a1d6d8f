"""`amptrain predict RUN`: one record a text, printed as the task says (`Task.printed_field`:
a translation's text or a language model's continuation alone, else one JSON line a record).
With `--input`, records are written as each chunk of lines is computed."""

import json

from amptrain.commands.options import add_trust_option

GENERATE_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")  # the [generate] keys


def add(commands):
    predict = commands.add_parser(
        "predict",
        help="label, tag or translate texts with a run's best checkpoint (JSON lines out; "
        "translation: one translated line a line)",
    )
    predict.add_argument("run_dir", help="a run folder, an export folder, or a pretrained language model's")
    source = predict.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", action="append", help="a text (repeatable)")
    source.add_argument("--input", help="a file of texts, one a line")
    source.add_argument(
        "--chat",
        action="append",
        help="a user's message to a chat model (repeatable): its reply alone is printed (with --json, the record)",
    )
    predict.add_argument("--system", help="with --chat: the system message before each user's")
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
    add_trust_option(predict)
    predict.set_defaults(run=run)


def run(args):
    from amptrain import api

    if args.chat:
        records = api.chat(args.run_dir, args.chat, args.system, args.trust_run_code, generating(args), args.precision)
        for record in records:
            print(json.dumps(record, ensure_ascii=False) if args.json else record["reply"])
        return 0
    if args.system:
        from amptrain.errors import UserError

        raise UserError("--system is for --chat; leave it out with --text and --input")
    from amptrain.serving.streaming import predict_lines, read_text_lines

    lines = read_text_lines(args.input) if args.input else None  # a bad file stops before any model loads
    predictor = api.predictor(
        args.run_dir, skip_blank=bool(args.input), trust_run_code=args.trust_run_code,
        overrides=generating(args), precision=args.precision,
    )  # fmt: skip
    field = predictor.task_class.printed_field
    records = predict_lines(predictor, lines) if args.input else predictor(args.text)
    for record in records:  # streamed with --input: each chunk's records as soon as they are computed
        if field is not None and field in record and not args.json:
            print(record[field], flush=bool(args.input))  # line i out for line i in
        else:
            print(json.dumps(record, ensure_ascii=False), flush=bool(args.input))
    return 0


def generating(args):
    """`--temperature 0.8` and the like as overrides of the run's `[generate]` section."""
    return [(f"generate.{name}", getattr(args, name)) for name in GENERATE_OPTIONS if getattr(args, name) is not None]
