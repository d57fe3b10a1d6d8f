"""The options several commands share, defined once: `--set`, `--trust-run-code`, and a
trained config's (fit, launch)."""


def add_set_option(command, help="override a config value (repeatable)"):
    """`--set SECTION.KEY=VALUE`, repeatable, into `args.overrides` (read as TOML, else a string)."""
    command.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help)


def add_trust_option(command):
    command.add_argument(
        "--trust-run-code",
        action="store_true",
        help="import the task module the run's config names even if you never ran `fit` with that file here "
        "(a run folder's config names code; without this, only code you trained with runs)",
    )


def add_run_options(command):
    """The options of a command that trains a config into a run folder (fit, launch)."""
    command.add_argument("config", help="a TOML config, e.g. configs/classify-spam.toml")
    add_set_option(command, "override a config value (repeatable); the value is read as TOML, else as a string")
    command.add_argument("--run-dir", help="run folder (default: runs/<config name>)")
    command.add_argument("--overwrite", action="store_true", help="delete the run folder and start afresh")
