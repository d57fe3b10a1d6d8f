"""`amptrain eval RUN`: a split (or another labelled file) scored with the best checkpoint,
printed as one JSON object."""

import json

from amptrain.commands.options import add_trust_option


def add(commands):
    evaluate = commands.add_parser("eval", help="score a split with a run's best checkpoint")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--split", default="test", choices=("dev", "test"))
    evaluate.add_argument("--data", help="score this labelled file instead of a split of the config")
    add_trust_option(evaluate)
    evaluate.set_defaults(run=run)


def run(args):
    from amptrain import api

    print(json.dumps(api.evaluate(args.run_dir, split=args.split, data=args.data, trust_run_code=args.trust_run_code)))
    return 0
