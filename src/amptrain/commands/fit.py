"""`amptrain fit CONFIG`: train (or resume) a run, then score its test split."""

from amptrain.commands.options import add_run_options


def add(commands):
    fit = commands.add_parser("fit", help="train (or resume) a run, then score its test split")
    add_run_options(fit)
    fit.set_defaults(run=run)


def run(args):
    from amptrain import api

    api.fit(args.config, args.overrides, run_dir=args.run_dir, overwrite=args.overwrite)
    return 0
