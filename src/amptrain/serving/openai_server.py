"""`amptrain serve` for a language model: OpenAI's API, so that any OpenAI client (the
`openai` package, LangChain, curl) can call a fine-tuned model.

    app = make_app(completer, "chat-smollm2", Limits(), max_waiting=64)   # a `Completer`
    GET  /v1/models, /v1/models/NAME            the one model served
    POST /v1/chat/completions                   messages through the model's chat template
    POST /v1/completions                        a text continued
    GET  /healthz, /metrics

A request's reply is generated a piece at a time in the model's one worker thread (the event
loop never waits on TensorFlow); with `"stream": true` each piece's text goes out as a
server-sent event as soon as it is final (`ReplyText`), ending in `data: [DONE]`. Requests
take turns, one generation at a time: more than `max_waiting` waiting or running are refused
(503) rather than queued without end, and a streaming client that goes away ends its
generation at the next piece. A bad request is a 4xx in OpenAI's error shape, decided before
it waits; a generation that fails answers its own request with a 500, and no other.
"""

import asyncio
import json
import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from amptrain.serving.openai_api import OpenAIError, ReplyText, check_context, parse_request
from amptrain.serving.rest import BadRequest
from amptrain.serving.server import Failures, Metrics, read_body


class Generations:
    """The completer's generations, one at a time in one worker thread."""

    def __init__(self, completer, max_waiting):
        self.completer, self.max_waiting = completer, max_waiting
        self.waiting = 0  # requests waiting for the worker or in it
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="amptrain-model")

    def check_room(self):
        """Refuses (503) a request beyond `max_waiting`, before it is answered at all."""
        if self.waiting >= self.max_waiting:
            raise OpenAIError(
                f"{self.waiting} requests are waiting for the model; at most {self.max_waiting} (--max-waiting). "
                "Try again later.",
                503,
                kind="server_error",
                code="overloaded",
            )

    async def run(self, prompt, settings, stops, emit=None, cancelled=None):
        """(text, finish reason, new pieces) of a generation; `emit(text)` is called from the
        worker as each piece's text becomes final; `cancelled` (a threading.Event) ends it early."""
        self.waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._worker, self._generate, prompt, settings, stops, emit, cancelled or threading.Event()
            )
        finally:
            self.waiting -= 1

    def _generate(self, prompt, settings, stops, emit, cancelled):
        if cancelled.is_set():  # the client left while it waited
            return "", "cancelled", 0
        text = ReplyText(self.completer.decode, stops)
        pieces = self.completer.pieces(prompt, **settings)
        try:
            for piece in pieces:
                new = text.add(piece)
                if new and emit:
                    emit(new)
                if text.stopped or cancelled.is_set():
                    break
        finally:
            pieces.close()
        rest = text.finish()
        if rest and emit:
            emit(rest)
        ended = pieces.finish_reason == "stop"  # the end piece was chosen: it counts as generated
        return text.text, "stop" if text.stopped or ended else "length", len(text.pieces) + ended

    async def close(self):
        await asyncio.to_thread(self._worker.shutdown, True)


def make_app(completer, name, limits, max_waiting=64, metrics=None):
    """The Starlette app serving `completer` (a language model's `Completer`) as `name`."""
    metrics = metrics or Metrics()
    failures, generations = Failures(), Generations(completer, max_waiting)
    created = int(time.time())

    def error(failure, route):
        metrics.requests.labels(route, str(failure.status)).inc()
        return JSONResponse(failure.body(), failure.status)

    async def models(request):
        metrics.requests.labels("models", "200").inc()
        return JSONResponse({"object": "list", "data": [_model(name, created)]})

    async def model(request):
        if request.path_params["model"] != name:
            message = f"the model {request.path_params['model']!r} does not exist; this server serves {name!r}"
            return error(OpenAIError(message, 404, "model", "model_not_found"), "models")
        metrics.requests.labels("models", "200").inc()
        return JSONResponse(_model(name, created))

    def completions(kind):
        async def answer(request):
            started = time.monotonic()
            try:
                request_, prompt, settings = await _prepared(request, kind, completer, name, limits)
                generations.check_room()
                if request_.stream:
                    metrics.requests.labels(kind, "200").inc()
                    events = _events(generations, request_, prompt, settings, name, failures)
                    return StreamingResponse(
                        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
                    )
                text, finish, count = await generations.run(prompt, settings, request_.stop)
            except OpenAIError as failure:
                return error(failure, kind)
            except Exception as failure:  # the server's fault: this request's 500, a line in the log
                return error(OpenAIError(failures.report(failure), 500, kind="server_error"), kind)
            metrics.latency.observe(time.monotonic() - started)
            metrics.requests.labels(kind, "200").inc()
            return JSONResponse(_answer(kind, _id(kind), name, text, finish, _usage(len(prompt), count)))

        return answer

    async def healthz(request):
        return JSONResponse({"status": "ready", "model": name})

    async def metrics_text(request):
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", completions("chat"), methods=["POST"]),
        Route("/v1/completions", completions("completions"), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=_lifespan(generations))


async def _prepared(request, kind, completer, name, limits):
    """(the parsed request, its prompt's pieces, the generation's settings, as `Completer.pieces`
    takes them): every 4xx decided
    here, before the request waits for the model."""
    from amptrain.errors import UserError

    try:
        body = await read_body(request, limits.max_body_bytes, limits.body_seconds)
    except BadRequest as bad:
        raise OpenAIError(str(bad), bad.status) from None
    parsed = parse_request(body, kind, name, limits)
    try:  # the template and the tokenizer, off the event loop
        if kind == "chat":
            prompt = await asyncio.to_thread(completer.chat_prompt, parsed.messages)
        else:
            prompt = await asyncio.to_thread(completer.text_prompt, parsed.prompt)
    except UserError as refused:  # no chat template; a conversation the template refuses
        raise OpenAIError(str(refused), param="messages" if kind == "chat" else "prompt") from None
    most = check_context(len(prompt), parsed.max_tokens, completer.context)
    seed = secrets.randbelow(2**31) if parsed.seed is None else (parsed.seed + 2**31) % 2**32 - 2**31
    return (
        parsed,
        prompt,
        {"max_new_tokens": most, "temperature": parsed.temperature, "top_p": parsed.top_p, "seed": seed},
    )


async def _events(generations, request, prompt, settings, name, failures):
    """The server-sent events of a streamed answer: OpenAI's chunks, then `data: [DONE]`."""
    loop, queue, cancelled = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()
    ident = _id(request.kind)

    def chunk(text=None, finish=None, usage=None, first=False):
        body = _chunk(request.kind, ident, name, text, finish, first)
        if usage is not None:
            body["choices"], body["usage"] = [], usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def emit(text):
        loop.call_soon_threadsafe(queue.put_nowait, text)

    job = asyncio.ensure_future(generations.run(prompt, settings, request.stop, emit, cancelled))
    job.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        if request.kind == "chat":
            yield chunk(first=True)
        while (text := await queue.get()) is not None:
            yield chunk(text)
        try:
            _, finish, count = job.result()
        except OpenAIError as failure:
            yield f"data: {json.dumps(failure.body())}\n\n"
            return
        except Exception as failure:
            yield f"data: {json.dumps(OpenAIError(failures.report(failure), 500, kind='server_error').body())}\n\n"
            return
        yield chunk(finish=finish)
        if request.include_usage:
            yield chunk(usage=_usage(len(prompt), count))
        yield "data: [DONE]\n\n"
    finally:  # the client left (or all is sent): the generation ends at its next piece
        cancelled.set()


def _id(kind):
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def _model(name, created):
    return {"id": name, "object": "model", "created": created, "owned_by": "amptrain"}


def _usage(prompt_tokens, completion_tokens):
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _answer(kind, ident, name, text, finish, usage):
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
        obj = "chat.completion"
    else:
        choice, obj = {"index": 0, "text": text, "logprobs": None}, "text_completion"
    choice["finish_reason"] = finish
    return {"id": ident, "object": obj, "created": int(time.time()), "model": name, "choices": [choice],
            "usage": usage}  # fmt: skip


def _chunk(kind, ident, name, text, finish, first):
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if first else {} if text is None else {"content": text}
        choice, obj = {"index": 0, "delta": delta, "logprobs": None}, "chat.completion.chunk"
    else:
        choice, obj = {"index": 0, "text": text or "", "logprobs": None}, "text_completion"
    choice["finish_reason"] = finish
    return {"id": ident, "object": obj, "created": int(time.time()), "model": name, "choices": [choice]}


def _lifespan(generations):
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:  # uvicorn has answered every request in flight by now
            await generations.close()

    return lifespan


def run(completer, source, host="127.0.0.1", port=8000, name=None, limits=None, max_waiting=64):
    """`amptrain serve` of a language model: warms the model up (its step traced), prints the
    base URL, and serves until SIGTERM (then 0)."""
    import os

    from amptrain.errors import UserError
    from amptrain.serving.rest import Limits
    from amptrain.serving.server import bind, serve

    limits = limits or Limits()
    name = name or os.path.basename(os.path.normpath(source)).removesuffix(".gguf")
    try:
        sock = bind(host, port)
    except OSError as failure:
        raise UserError(f"--host {host} --port {port}: cannot listen there ({failure.strerror})") from None
    started = time.monotonic()
    completer.warm_up()
    routes = "/v1/chat/completions, /v1/completions" if completer.template else "/v1/completions (no chat template)"
    print(
        f"amptrain serve: language model {name!r} from {source} ({completer.context} positions; ready in "
        f"{time.monotonic() - started:.0f} s) at http://{host}:{sock.getsockname()[1]}/v1 (OpenAI API: {routes})",
        flush=True,
    )
    serve(make_app(completer, name, limits, max_waiting), sock, header_seconds=limits.header_seconds)
    print("amptrain serve: stopped; every request in flight was answered", flush=True)
    return 0
