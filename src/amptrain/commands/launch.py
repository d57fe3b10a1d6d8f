"""`amptrain launch --workers N CONFIG`: a multi-worker run on this machine, N `fit` processes
over localhost (worker 0 writes the run folder)."""

from amptrain.commands.options import add_run_options


def add(commands):
    launch = commands.add_parser(
        "launch",
        help="a multi-worker run on this machine: N `fit` processes over localhost (worker 0 writes the run folder)",
    )
    launch.add_argument("--workers", type=int, required=True, help="how many worker processes (2 or more)")
    add_run_options(launch)  # the same as fit's: each worker runs `fit` with them
    launch.set_defaults(run=run)


def run(args):
    from amptrain.launch import launch

    # Each worker runs the command's main (`cli.main`, which set `args.main`), forked after the
    # import where it can be (launch.py).
    return launch(
        args.config, args.workers, args.overrides, run_dir=args.run_dir, overwrite=args.overwrite, main=args.main
    )
