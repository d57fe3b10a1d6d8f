"""`amptrain serve EXPORT`: TF Serving's REST API over an export, batching across requests; its
arguments are checked before TensorFlow loads (`serving/server.py` does the serving)."""


def add(commands):
    """`amptrain serve`'s arguments, on the CLI's subcommands."""
    serve = commands.add_parser(
        "serve",
        help="serve an export over TF Serving's REST API (/v1/models/NAME:predict), batching across requests",
    )
    serve.add_argument("export_dir", help="an export folder of version folders (RUN/export), or a run folder")
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
    batching = {"max_batch_size": args.max_batch_size, "max_wait_ms": args.batch_wait_ms}
    return run(args.export_dir, args.host, args.port, args.name, limits, batching, args.poll_seconds)
