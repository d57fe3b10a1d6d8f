"""OpenAI's chat completions and completions requests and answers: pure logic, no server, no
TensorFlow (`openai_server.py` serves them).

    request = parse_request(body, "chat", "smollm2-chat", Limits())   # or "completions"
    request.messages, request.max_tokens, request.temperature, request.stop, request.stream
    text = ReplyText(decode, request.stop)      # pieces in, text safe to send out
    text.add(piece)                             # the new text ("" while it may still end in a stop)

A malformed request raises `OpenAIError` (400, or 404 for another model's name) with the
parameter it names, answered in OpenAI's error shape: `{"error": {"message", "type", "param",
"code"}}`. Parameters amptrain does not honour are refused by name, not ignored, unless they
change nothing (`n` = 1, penalties of 0, `logprobs` false, `user`).
"""

import json
from dataclasses import dataclass

from amptrain.serving.rest import BadRequest, json_object, utf8_text

ROLES = ("system", "user", "assistant")
MAX_STOPS = 4  # OpenAI's
COMPLETIONS_MAX_TOKENS = 16  # the legacy completions' default, OpenAI's
NEUTRAL = {"n": 1, "frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "echo": False, "best_of": 1}
COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "user"}
FIELDS = {
    "chat": COMMON | {"messages", "max_completion_tokens"} | (set(NEUTRAL) - {"echo", "best_of"}),
    "completions": COMMON | {"prompt"} | set(NEUTRAL),
}


class OpenAIError(Exception):
    """A request's error, as OpenAI writes it."""

    def __init__(self, message, status=400, param=None, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self):
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Request:
    kind: str  # "chat" or "completions"
    messages: list | None  # chat: [{"role", "content"}] with text contents
    prompt: str | None  # completions
    max_tokens: int | None  # None: what the context leaves (chat)
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple
    stream: bool
    include_usage: bool


def parse_request(body, kind, model_name, limits):
    """The `Request` of a POST body (bytes) to the chat completions (`kind` "chat") or the
    completions route, checked against the served `model_name` and `limits`."""
    document = _document(body, limits)
    unknown = sorted(set(document) - FIELDS[kind])
    if unknown:
        raise OpenAIError(f"unsupported parameter {unknown[0]!r}", param=unknown[0], code="unsupported_parameter")
    for name, neutral in NEUTRAL.items():
        if name in document and document[name] not in (neutral, None):
            raise OpenAIError(f"{name}: only {json.dumps(neutral)} is supported here", param=name)
    model = _required(document, "model", str, "a string")
    if model != model_name:
        raise OpenAIError(f"the model {model!r} does not exist; this server serves {model_name!r}", 404, "model",
                          "model_not_found")  # fmt: skip
    if kind == "chat":
        messages, prompt = _messages(_required(document, "messages", list, "a list of messages"), limits), None
    else:
        messages, prompt = None, _prompt(document.get("prompt"), limits)
    most = document.get("max_completion_tokens", document.get("max_tokens"))
    if most is None and kind == "completions":
        most = COMPLETIONS_MAX_TOKENS
    stream_options = _optional(document, "stream_options", dict, "an object", {})
    return Request(
        kind,
        messages,
        prompt,
        _whole(most, "max_tokens", 1) if most is not None else None,
        _number(document, "temperature", 1.0, 0.0, 2.0),
        _number(document, "top_p", 1.0, 0.0, 1.0, open_low=True),
        _seed(document.get("seed")),
        _stops(document.get("stop")),
        _optional(document, "stream", bool, "true or false", False),
        bool(stream_options.get("include_usage", False)),
    )


def _document(body, limits):
    try:
        return json_object(body, limits)
    except BadRequest as bad:
        raise OpenAIError(str(bad).replace('{"instances": [strings]}', "a JSON object"), bad.status) from None


def _required(document, name, kind, expected):
    if name not in document:
        raise OpenAIError(f"missing required parameter {name!r}", param=name, code="missing_required_parameter")
    return _optional(document, name, kind, expected, None)


def _optional(document, name, kind, expected, default):
    value = document.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise OpenAIError(f"{name}: expected {expected}, received {json.dumps(value)[:60]}", param=name)
    return value


def _number(document, name, default, low, high, open_low=False):
    value = document.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not (low < value if open_low else low <= value):
        raise OpenAIError(f"{name}: expected a number from {low} to {high}, received {json.dumps(value)}", param=name)
    if value > high:
        raise OpenAIError(f"{name}: expected a number from {low} to {high}, received {value}", param=name)
    return float(value)


def _whole(value, name, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OpenAIError(f"{name}: expected an integer >= {low}, received {json.dumps(value)[:60]}", param=name)
    return value


def _seed(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise OpenAIError(f"seed: expected a 64-bit integer, received {json.dumps(value)[:60]}", param="seed")
    return value


def _stops(value):
    stops = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise OpenAIError(
            f"stop: expected a non-empty string or a list of at most {MAX_STOPS}, received {json.dumps(value)[:60]}",
            param="stop",
        )
    return tuple(stops)


def _messages(messages, limits):
    if not messages:
        raise OpenAIError("messages: expected at least one message", param="messages")
    parsed = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else None
            raise OpenAIError(f"{where}.role: expected one of {list(ROLES)}, received {json.dumps(role)}", param=where)
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise OpenAIError(f"{where}: unsupported field {extra[0]!r}", param=f"{where}.{extra[0]}")
        parsed.append({"role": message["role"], "content": _content(message.get("content"), where, limits)})
    return parsed


def _content(content, where, limits):
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(
                    f'{where}.content[{j}]: expected {{"type": "text", "text": ...}}; this model reads text only',
                    param=f"{where}.content",
                )
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise OpenAIError(f"{where}.content: expected a string, received {json.dumps(content)[:60]}",
                          param=f"{where}.content")  # fmt: skip
    return _text(content, f"{where}.content", limits)


def _prompt(prompt, limits):
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise OpenAIError(f"prompt: expected a string (one prompt a request), received {json.dumps(prompt)[:60]}",
                          param="prompt")  # fmt: skip
    return _text(prompt, "prompt", limits)


def _text(text, where, limits):
    if len(text) > limits.max_text_chars:
        raise OpenAIError(f"{where}: {len(text)} characters; at most {limits.max_text_chars} (--max-text-chars)",
                          param=where)  # fmt: skip
    try:
        return utf8_text(text, where)
    except BadRequest as bad:
        raise OpenAIError(str(bad), param=where) from None


def check_context(prompt_tokens, max_tokens, context):
    """The new pieces a request may have: `max_tokens`, or all the context leaves when None;
    a 400 in OpenAI's words when the prompt and they do not fit."""
    wanted = context - prompt_tokens if max_tokens is None else max_tokens
    if prompt_tokens + max(wanted, 1) > context:
        raise OpenAIError(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max(wanted, 1)} tokens ({prompt_tokens} in the prompt, {max(wanted, 1)} for the "
            "completion). Please reduce the prompt or the completion's max_tokens.",
            param="max_tokens" if max_tokens is not None and prompt_tokens < context else "messages",
            code="context_length_exceeded",
        )
    return wanted


class ReplyText:
    """The text of the pieces generated so far, given out as it becomes final: what could
    still be the start of a stop string, or an unfinished UTF-8 character, is held back.
    `stopped`: a stop string was met (the text ends before it, and nothing more comes)."""

    def __init__(self, decode, stops=()):
        self._decode, self._stops = decode, tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.pieces, self.sent, self.stopped = [], 0, False
        self._text = ""

    def add(self, piece):
        """The text that `piece` makes final ("" if none)."""
        self.pieces.append(piece)
        self._text = self._decode(self.pieces)
        settled = len(self._text)
        while settled > self.sent and self._text[settled - 1] == "\ufffd":  # maybe a character still in pieces
            settled -= 1
        if self._stopped_within(settled):
            return self._take(len(self._text))
        return self._take(settled - self._hold)

    def finish(self):
        """The text held back, once no piece comes."""
        self._stopped_within(len(self._text))
        return self._take(len(self._text))

    def _stopped_within(self, end):
        """True (the text cut before it) if a stop string is within the first `end` characters."""
        found = [i for i in (self._text.find(s, 0, end) for s in self._stops) if i >= 0]
        if found:
            self.stopped, self._text = True, self._text[: min(found)]
        return bool(found)

    @property
    def text(self):
        return self._text

    def _take(self, end):
        if end <= self.sent:
            return ""
        new, self.sent = self._text[self.sent : end], end
        return new
