"""The subcommands of `amptrain`, one module each: its arguments (`add`), the call into
`amptrain.api` or the module that does the work, and what it prints. `amptrain/cli.py`
only dispatches. What a command prints is its contract with the scripts that read it."""
