"""`amptrain serve`: an export behind TF Serving's REST API, on Starlette and uvicorn.

    app = make_app(Versions("runs/classify-spam/export", batching), "classify-spam", Limits())
    serve(app, "127.0.0.1", 8501)      # until SIGTERM or Ctrl-C: requests in flight answered, exit 0

    POST /v1/models/NAME[/versions/N]:predict   {"instances": [...]} or {"inputs": [...]}
    GET  /v1/models/NAME[/versions/N]           {"model_version_status": [...]}
    GET  /v1/models/NAME[/versions/N]/metadata  the signatures
    GET  /healthz (ready: the model is loaded and answers), GET /metrics (Prometheus text)

Request parsing and the response's JSON are `rest.py`'s; batching across requests is
`batcher.py`'s, the versions and their poll `versions.py`'s. The app never blocks its event
loop on TensorFlow: a model call is in the batcher's worker thread, a load in another.
"""

import asyncio
import contextlib
import signal
import socket
import sys
import time

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from amptrain.serving.rest import BadRequest, format_predictions, parse_predict
from amptrain.serving.versions import NotFound

DISCARD_FACTOR = 16  # a body over the limit is read on (not kept) up to this many limits, then cut


class Metrics:
    """Prometheus counters of the requests, their latency and the model calls' batch sizes."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()  # the app's own, not the process-wide default
        self.requests = Counter(
            "amptrain_serve_requests", "HTTP requests by route and status", ["route", "code"], registry=self.registry
        )
        self.latency = Histogram(
            "amptrain_serve_predict_seconds", "predict request latency (body read to response)", registry=self.registry
        )
        self.batch = Histogram(
            "amptrain_serve_batch_texts",
            "texts in one model call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.model = Histogram("amptrain_serve_model_seconds", "one model call", registry=self.registry)

    def on_batch(self, texts, seconds):
        self.batch.observe(texts)
        self.model.observe(seconds)

    def text(self):
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def make_app(versions, name, limits, metrics=None, poll_seconds=0.0):
    """The Starlette app serving `versions` as model `name`."""
    metrics = metrics or Metrics()
    failures = Failures()

    def error(message, status, route):
        metrics.requests.labels(route, str(status)).inc()
        return JSONResponse({"error": message}, status)

    def servable(request):
        return _servable(request, versions, name)

    async def predict(request):
        started = time.monotonic()
        try:
            outputs, parsed = await _predict(request, await servable(request), limits)
        except BadRequest as bad:
            return error(str(bad), bad.status, "predict")
        except NotFound as missing:
            return error(str(missing), 404, "predict")
        except Exception as failure:  # the server's fault: a line a request, the traceback once
            return error(failures.report(failure), 500, "predict")
        body = format_predictions(outputs, parsed.columnar)
        metrics.latency.observe(time.monotonic() - started)
        metrics.requests.labels("predict", "200").inc()
        return JSONResponse(body)

    async def status(request):
        if any(":" in value for value in request.path_params.values()):  # GET /v1/models/NAME:predict
            return error(_method_refusal(request), 405, "status")
        try:
            model = await servable(request)
        except NotFound as missing:
            return error(str(missing), 404, "status")
        shown = [model] if "version" in request.path_params else list(versions.loaded().values())
        metrics.requests.labels("status", "200").inc()
        return JSONResponse({"model_version_status": [_version_status(s) for s in shown]})

    async def metadata(request):
        try:
            model = await servable(request)
        except NotFound as missing:
            return error(str(missing), 404, "metadata")
        metrics.requests.labels("metadata", "200").inc()
        spec = {"name": name, "signature_name": "", "version": str(model.version)}
        return JSONResponse(
            {"model_spec": spec, "metadata": {"signature_def": {"signature_def": model.signature_defs()}}}
        )

    async def healthz(request):
        return JSONResponse({"status": "ready", "model": name, "version": versions.newest.version})

    async def metrics_text(request):
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    routes = _routes(predict, status, metadata, healthz, metrics_text)
    return Starlette(routes=routes, lifespan=_lifespan(versions, poll_seconds))


async def _predict(request, model, limits):
    """(the outputs, the parsed request) of a predict request to `model`."""
    body = await read_body(request, limits.max_body_bytes, limits.body_seconds)
    parsed = parse_predict(body, limits, model.ids)
    if parsed.texts is None:  # a token-ids signature: one call of its own
        return await model.batcher.run_alone(model.call_signature, parsed.signature, parsed.tensors), parsed
    return await model.batcher.predict(parsed.texts), parsed


def _method_refusal(request):
    method = request.url.path.rpartition(":")[2]
    return f"{request.method} {request.url.path}: {method} takes POST with a JSON body, not {request.method}"


class Failures:
    """A failed request's one line for the log and the answer; the traceback of each kind of
    failure printed once (a failure repeated by every request would fill the log)."""

    def __init__(self):
        self.seen = set()

    def report(self, failure):
        import traceback

        line = f"{type(failure).__name__}: {(str(failure).strip().splitlines() or [''])[0][:300]}"
        kind = (type(failure), line)
        if kind not in self.seen:
            self.seen.add(kind)
            traceback.print_exception(failure, file=sys.stderr)
        print(f"amptrain serve: a request failed: {line}", file=sys.stderr, flush=True)
        return f"internal error: {line}"


async def _servable(request, versions, name):
    """The version a request's path names (the newest if none)."""
    if request.path_params["name"] != name:
        raise NotFound(f"model {request.path_params['name']!r} not found; this server serves {name!r}")
    version = request.path_params.get("version")
    if version is not None and not version.isdigit():
        raise NotFound(f"version {version!r} not found: expected a number")
    return await versions.get(None if version is None else int(version))


def _routes(predict, status, metadata, healthz, metrics_text):
    """TF Serving's REST paths (a version's before the model's), then health and metrics."""
    return [
        Route("/v1/models/{name}:predict", predict, methods=["POST"]),
        Route("/v1/models/{name}/versions/{version}:predict", predict, methods=["POST"]),
        Route("/v1/models/{name}/metadata", metadata, methods=["GET"]),
        Route("/v1/models/{name}/versions/{version}/metadata", metadata, methods=["GET"]),
        Route("/v1/models/{name}", status, methods=["GET"]),
        Route("/v1/models/{name}/versions/{version}", status, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]


def _version_status(servable):
    return {"version": str(servable.version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}


async def read_body(request, limit, seconds=None):
    """The request's body, refused (413) past `limit` bytes without keeping more than that:
    the rest is read and dropped (up to DISCARD_FACTOR limits), so that the client reads the
    error rather than a reset connection; and refused (408) when it has not all come within
    `seconds`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit * DISCARD_FACTOR:
        raise BadRequest(f"request body of {declared} bytes; at most {limit} (--max-body-bytes)", 413)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size <= limit:
                    chunks.append(chunk)
                elif size > limit * DISCARD_FACTOR:
                    break
    except TimeoutError:
        raise BadRequest(f"request body not received within {seconds:g} s (--body-timeout)", 408) from None
    if size > limit:
        raise BadRequest(
            f"request body of {size if size <= limit * DISCARD_FACTOR else 'over ' + str(size)} bytes; "
            f"at most {limit} (--max-body-bytes)",
            413,
        )
    return b"".join(chunks)


def _lifespan(versions, poll_seconds):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        poller = asyncio.get_running_loop().create_task(_poll(versions, poll_seconds)) if poll_seconds > 0 else None
        try:
            yield
        finally:  # uvicorn has answered every request in flight by now
            if poller is not None:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
            for servable in versions.loaded().values():
                await servable.batcher.close()

    return lifespan


async def _poll(versions, seconds):
    """TF Serving's file-system poll: every `seconds`, what is on disk is served (a newer
    version folder loaded, a removed one unloaded); a folder that fails to load is named once."""
    while True:
        await asyncio.sleep(seconds)
        before = versions.newest.version
        try:
            forgotten, failed = await asyncio.to_thread(versions.refresh)
        except Exception as failure:  # unforeseen: say so and keep serving what is loaded
            print(f"amptrain serve: cannot refresh the versions in {versions.folder}: {failure}", file=sys.stderr)
            continue
        for line in failed:  # a broken new folder: the old one stays the default
            print(f"amptrain serve: {line}", file=sys.stderr, flush=True)
        if versions.newest.version != before:
            print(f"amptrain serve: now serving version {versions.newest.version}", flush=True)
        for servable in forgotten:
            await servable.batcher.close()


def bind(host, port):
    """A listening socket on host:port (port 0: a free one), bound before uvicorn starts so
    that the URL printed is the one that answers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (the accepted ones inherit it); without it Nagle holds the response's second write for
    # the client's delayed ACK, 40 ms a request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve(app, sock, graceful_seconds=30, header_seconds=10.0):
    """Runs `app` on `sock` until SIGTERM or Ctrl-C; requests in flight are answered first. A
    connection whose request line and headers have not all come within `header_seconds` (of
    its opening, or of its previous answer) is closed."""
    import uvicorn

    from amptrain.serving.deadlines import with_header_deadline

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        http=with_header_deadline(header_seconds),
        loop="asyncio",
        lifespan="on",
        timeout_graceful_shutdown=graceful_seconds,
    )
    # uvicorn re-raises a SIGTERM it caught once it has shut down; a handler of ours takes it,
    # so that a drained shutdown exits 0 instead of dying of the signal.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(export_dir, host="127.0.0.1", port=8501, name=None, limits=None, batching=None, poll_seconds=5.0):
    """`amptrain serve`: loads the newest version of `export_dir`, prints the URL and the
    signatures, and serves until SIGTERM (then 0)."""
    import os

    from amptrain.errors import UserError
    from amptrain.serving.rest import Limits
    from amptrain.serving.versions import Versions

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: expected a port from 0 to 65535 (0: a free one)")
    limits = limits or Limits()
    metrics = Metrics()
    versions = Versions(export_dir, batching or {}, metrics.on_batch)
    name = name or os.path.basename(versions.newest.metadata.get("run_dir") or os.path.dirname(versions.folder))
    try:
        sock = bind(host, port)
    except OSError as failure:
        raise UserError(f"--host {host} --port {port}: cannot listen there ({failure.strerror})") from None
    bound = sock.getsockname()[1]
    newest = versions.newest
    print(
        f"amptrain serve: {newest.metadata['task']} model {name!r} version {newest.version} from {versions.folder} "
        f"at http://{host}:{bound}/v1/models/{name}",
        flush=True,
    )
    for signature, spec in newest.signature_defs().items():
        ins = ", ".join(f"{k} {v['dtype']}" for k, v in spec["inputs"].items())
        print(f"  signature {signature}: ({ins}) -> {', '.join(spec['outputs'])}", flush=True)
    app = make_app(versions, name, limits, metrics, poll_seconds)
    serve(app, sock, header_seconds=limits.header_seconds)
    print("amptrain serve: stopped; every request in flight was answered", flush=True)
    return 0
