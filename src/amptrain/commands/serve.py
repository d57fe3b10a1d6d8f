"""`amptrain serve EXPORT`: TF Serving's REST API over an export, batching across requests; or
OpenAI's API over a language model (a run of the language-model task, a pretrained folder, a
transformers export, a GGUF file). Its arguments are checked before TensorFlow loads
(`serving/server.py` and `serving/openai_server.py` do the serving)."""

import os


def add(commands):
    """`amptrain serve`'s arguments, on the CLI's subcommands."""
    serve = commands.add_parser(
        "serve",
        help="serve an export over TF Serving's REST API (/v1/models/NAME:predict), batching across requests, "
        "or a language model over OpenAI's API (/v1/chat/completions)",
    )
    serve.add_argument(
        "export_dir",
        help="an export folder of version folders (RUN/export), or a run folder; a language model's run, "
        "pretrained folder or .gguf file: OpenAI's API",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8501, help="the port (default 8501, TF Serving's; 0: a free one)")
    serve.add_argument("--name", help="the model's name in the URLs (default: the run folder's name)")
    serve.add_argument("--max-batch-size", type=int, default=32, help="texts in one model call at most (default 32)")
    serve.add_argument(
        "--batch-wait-ms", type=float, default=5.0, help="how long a batch waits for more requests (default 5)"
    )
    serve.add_argument("--max-body-bytes", type=int, default=4 << 20, help="a request's body at most (default 4 MiB)")
    serve.add_argument("--max-instances", type=int, default=1024, help="texts in one request at most (default 1024)")
    serve.add_argument(
        "--max-text-chars",
        type=int,
        default=10_000,
        help="a longer text is cut to this many characters (default 10000)",
    )
    serve.add_argument(
        "--poll-seconds", type=float, default=5.0, help="look for a new version folder this often (default 5; 0: never)"
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="close a connection whose request line and headers take longer, in seconds (default 10)",
    )
    serve.add_argument(
        "--body-timeout", type=float, default=30.0, help="answer 408 to a body that takes longer (default 30 s)"
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=64,
        help="a language model: requests waiting or generating at most; more are refused (503) (default 64)",
    )
    serve.add_argument(
        "--precision",
        choices=("float32", "bfloat16", "float16"),
        help="a pretrained folder's precision (default float32; a run serves in its own)",
    )
    serve.set_defaults(run=run)


def run(args):
    """`amptrain serve`: the arguments checked (before TensorFlow loads), then `server.run`."""
    from amptrain.errors import UserError

    if args.max_batch_size < 1 or args.batch_wait_ms < 0:
        raise UserError(
            f"--max-batch-size {args.max_batch_size} --batch-wait-ms {args.batch_wait_ms}: expected >= 1, >= 0"
        )
    if min(args.max_body_bytes, args.max_instances, args.max_text_chars) < 1:
        raise UserError("--max-body-bytes, --max-instances and --max-text-chars: expected whole numbers >= 1")
    if not min(args.header_timeout, args.body_timeout) > 0:
        raise UserError(f"--header-timeout {args.header_timeout} --body-timeout {args.body_timeout}: expected > 0")
    try:
        import prometheus_client  # noqa: F401  (the serve extra, checked before TensorFlow loads)
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as missing:
        raise UserError(
            f"amptrain serve needs the serve extra ({missing.name} is missing): pip install 'amptrain[serve]'"
        ) from None
    from amptrain.serving.rest import Limits
    from amptrain.serving.server import run

    limits = Limits(
        args.max_body_bytes, args.max_instances, args.max_text_chars, args.header_timeout, args.body_timeout
    )
    if serves_language_model(args.export_dir):
        return run_language_model(args, limits)
    if args.precision is not None:
        raise UserError(f"{args.export_dir}: --precision is for a language model's pretrained folder")
    batching = {"max_batch_size": args.max_batch_size, "max_wait_ms": args.batch_wait_ms}
    return run(args.export_dir, args.host, args.port, args.name, limits, batching, args.poll_seconds)


def serves_language_model(path):
    """True where `path` is served over OpenAI's API: a pretrained folder (config.json, as
    `transformers` saves it, or amptrain's transformers export), a .gguf file, or a run folder
    of the language-model task (its SavedModel export, RUN/export, is TF Serving's)."""
    import tomllib

    if os.path.isfile(path):
        return path.endswith(".gguf")
    if os.path.isfile(os.path.join(path, "config.json")) and not os.path.exists(os.path.join(path, "config.toml")):
        return True
    from amptrain import registry
    from amptrain.errors import UserError

    try:
        with open(os.path.join(path, "config.toml"), "rb") as f:
            task = tomllib.load(f).get("task")
        return registry.task_class(task, []).pretrained_kind == "causal"  # a built-in task's class
    except (OSError, tomllib.TOMLDecodeError):
        return False  # not a run folder (an export, say): TF Serving's, which names what is wrong
    except (UserError, ImportError):  # a user's task, imported only with its trust: TF Serving's
        return False


def run_language_model(args, limits):
    """`amptrain serve` of a language model: loaded as `predict` loads it (a run's best
    checkpoint), then OpenAI's API."""
    from amptrain import api
    from amptrain.errors import UserError
    from amptrain.serving import openai_server
    from amptrain.tasks.language_model.completions import Completer

    if args.max_waiting < 1 or not 0 <= args.port <= 65535:
        raise UserError(f"--max-waiting {args.max_waiting} --port {args.port}: expected >= 1, a port from 0 to 65535")
    print(f"amptrain serve: loading the language model {args.export_dir}", flush=True)
    task, model, _, _ = api.load_run(args.export_dir, (), precision=args.precision)
    completer = Completer(task, model)
    return openai_server.run(completer, args.export_dir, args.host, args.port, args.name, limits, args.max_waiting)
