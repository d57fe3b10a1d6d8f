"""Conversations for chat fine-tuning: read from JSONL, rendered with the model's own chat
template as `transformers` renders it, tokenized, and marked so that the loss falls on the
assistant's replies alone.

    conversations = read_chat("data/chat-en-es/train.jsonl")        # [[{"role", "content"}, ...], ...]
    template = ChatTemplate.from_folder("pretrained/SmolLM2-135M-Instruct", special_tokens)
    text = template.render(conversation, add_generation_prompt=False)
    ids, scored = encode_conversation(template, tokenizer, conversation)   # scored: 1 on reply pieces

A line is `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}` (what
OpenAI, TRL and torchtune read) or `{"prompt": "...", "completion": "..."}` (a user turn and
the assistant's reply); the format is told from each line's keys. A bad line is one error
naming file:line and what was expected.

The template is Jinja2 in `transformers`' environment: an immutable sandbox with
`trim_blocks` and `lstrip_blocks`, loop controls, its `tojson` filter, `raise_exception`,
`strftime_now`, a `dict` and a `namespace` that refuse underscore names, `{% generation %}`
blocks rendered as they are; the special tokens (`bos_token`, `eos_token`, ...) as variables.
A template that reaches outside the sandbox is refused in one line.

The reply of assistant turn i is the text the conversation up to it adds after the same
conversation rendered up to the turn before, with the generation prompt: its content and the
end token that closes it (the newline after is the template's, not scored).
"""

import functools
import json
import os

import numpy as np

from amptrain.errors import ConfigError, DataError

ROLES = ("system", "user", "assistant")
TEMPLATE_FILE = "chat_template.jinja"


def read_chat(path):
    """The conversations of a JSONL file, each a list of {"role", "content"} messages."""
    from amptrain.data.readers import json_object, read_lines

    def parse(f):
        lines = ((number, line) for number, line in enumerate(f, 1) if line.strip())
        return [_conversation(json_object(path, number, line), path, number) for number, line in lines]

    conversations = read_lines(path, parse)
    if not conversations:
        raise DataError(f"{path}: no conversation; expected a JSON object a line with messages or prompt/completion")
    return conversations


def _conversation(record, path, number):
    where = f"{path}:{number}"
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(
                f"{where}: messages: expected a list of {{role, content}} objects, received {messages!r:.60}"
            )
        conversation = [_message(m, where, i) for i, m in enumerate(messages)]
    elif "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise DataError(f"{where}: prompt and completion: expected strings")
        conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    else:
        keys = ", ".join(sorted(record)) or "none"
        raise DataError(f"{where}: expected the key messages, or prompt and completion; found {keys}")
    if not any(m["role"] == "assistant" for m in conversation):
        raise DataError(f"{where}: no assistant message; expected at least one reply to learn")
    return conversation


def _message(message, where, index):
    if not isinstance(message, dict):
        raise DataError(f"{where}: messages[{index}]: expected an object with role and content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise DataError(f"{where}: messages[{index}].role: expected one of {', '.join(ROLES)}, received {role!r:.40}")
    if not isinstance(content, str):
        raise DataError(f"{where}: messages[{index}].content: expected a string, received {content!r:.40}")
    return {"role": role, "content": content}


class ChatTemplate:
    """A folder's chat template, compiled once in `transformers`' sandbox."""

    def __init__(self, source, special_tokens=None, origin="chat template"):
        self.source, self.origin = source, origin
        self.special_tokens = dict(special_tokens or {})
        self._template = _compile(source, origin)

    @classmethod
    def from_folder(cls, folder, special_tokens=None):
        """`chat_template.jinja`, else `chat_template` of `tokenizer_config.json`; one line if
        neither. The special tokens default to tokenizer_config.json's (`bos_token`, ...)."""
        if special_tokens is None:
            special_tokens = special_tokens_of(folder)
        path = os.path.join(folder, TEMPLATE_FILE)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return cls(f.read(), special_tokens, path)
        config_path = os.path.join(folder, "tokenizer_config.json")
        source = None
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as f:
                source = json.load(f).get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str):
            raise ConfigError(
                f"{folder}: no chat template; expected {TEMPLATE_FILE} or chat_template in tokenizer_config.json"
            )
        return cls(source, special_tokens, config_path)

    def render(self, messages, add_generation_prompt=False):
        import jinja2

        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens
            )
        except jinja2.exceptions.SecurityError as error:
            raise ConfigError(f"{self.origin}: the template reaches outside its sandbox ({error})") from None
        except jinja2.exceptions.TemplateError as error:
            raise DataError(f"{self.origin}: the template refused a conversation: {error}") from None


def special_tokens_of(folder):
    """{"bos_token": "<|im_start|>", ...}: the `*_token` strings of the folder's tokenizer_config.json,
    which `transformers` hands a chat template as variables."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    found = {}
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            found[key] = value
    return found


def _compile(source, origin):
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ConfigError(f"{origin}:{error.lineno}: not a Jinja template ({error.message})") from None


def _raise_exception(message):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """`transformers`' `tojson`: no HTML escaping, json.dumps' options."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    from datetime import datetime

    return datetime.now().strftime(format)


class _Dict:
    """`dict` in a template: a call and `fromkeys`, nothing to reach through."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@functools.cache
def _environment():
    """The sandbox, its extensions, filters and globals: `transformers`' own."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: the body rendered as it is."""

        tags = {"generation"}

        def parse(self, parser):
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(line)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """`namespace()`, refusing attributes that start with "_"."""

        def __init__(*args, **kwargs):
            self, values = args[0], dict(*args[1:], **kwargs)
            for name in values:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name, value):
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(), namespace=Namespace
    )
    return environment


def reply_spans(template, messages, end_token):
    """[(start, end)] character spans of the rendered conversation that are replies: each
    assistant turn's content and the `end_token` that closes it."""
    text = template.render(messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True) if i else ""
        upto = template.render(messages[: i + 1])
        if not upto.startswith(before) or not text.startswith(upto):
            raise DataError(
                f"{template.origin}: the conversation rendered up to turn {i} does not start with its rendering "
                "before the turn; expected a template that appends turns"
            )
        end = upto.find(end_token, len(before)) if end_token else -1  # content may be trimmed: from the start
        spans.append((len(before), end + len(end_token) if end >= 0 else len(upto)))
    return text, spans


def encode_conversation(template, tokenizer, messages, end_token, score_all=False):
    """(piece ids, 1 for each piece of a reply and 0 elsewhere) of the rendered conversation,
    tokenized as `apply_chat_template` does (the template's own special pieces, none added).
    A piece that straddles a reply's start (" E" of ": En") is the reply's, as `transformers`'
    assistant mask counts it. `tokenizer`: a `tokenizers.Tokenizer`. `score_all`: every piece scored."""
    text, spans = reply_spans(template, messages, end_token)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    scored = []
    for start, end in encoding.offsets:
        overlaps = any(start < e and end > s for s, e in spans)  # a piece that carries a reply's character
        scored.append(1 if score_all or overlaps else 0)
    return list(encoding.ids), scored


def fit_to_block(ids, scored, length):
    """(ids, scored) of a conversation cut to at most `length` pieces at the end of its last
    reply that fits (a turn boundary), or None when not even its first reply fits."""
    if len(ids) <= length:
        return ids, scored
    ends = [i + 1 for i in range(min(len(scored), length)) if scored[i] and (i + 1 == len(scored) or not scored[i + 1])]
    if not ends:
        return None
    return ids[: ends[-1]], scored[: ends[-1]]


def pack(conversations, length):
    """Conversations [(ids, scored)] packed in order into blocks of `length` positions, a new
    block when the next does not fit. Returns ({"token_ids", "labels", "segment_ids",
    "positions"}: (blocks, length) int32 arrays, and {"conversations", "cut", "dropped",
    "tokens_seen", "tokens_scored", "padding"}). A position's label is the next piece where
    that piece is scored, else -1; segments and positions restart at each conversation (the
    language model attends within a segment), padding is segment -1."""
    rows, row, stats = [], [], {"conversations": 0, "cut": 0, "dropped": 0, "tokens_seen": 0, "tokens_scored": 0}
    for ids, scored in conversations:
        fitted = fit_to_block(ids, scored, length)
        if fitted is None:
            stats["dropped"] += 1
            continue
        stats["cut"] += len(fitted[0]) < len(ids)
        if sum(len(c[0]) for c in row) + len(fitted[0]) > length:
            rows.append(row)
            row = []
        row.append(fitted)
    if row:
        rows.append(row)
    arrays = {name: np.full((len(rows), length), fill, np.int32) for name, fill in
              (("token_ids", 0), ("labels", -1), ("segment_ids", -1), ("positions", 0))}  # fmt: skip
    for r, members in enumerate(rows):
        at = 0
        for segment, (ids, scored) in enumerate(members):
            n = len(ids)
            arrays["token_ids"][r, at : at + n] = ids
            arrays["labels"][r, at : at + n - 1] = np.where(np.asarray(scored[1:]) > 0, ids[1:], -1)
            arrays["segment_ids"][r, at : at + n] = segment
            arrays["positions"][r, at : at + n] = np.arange(n)
            at += n
            stats["conversations"] += 1
            stats["tokens_seen"] += n
    stats["tokens_scored"] = int((arrays["labels"] >= 0).sum())
    stats["padding"] = int((arrays["segment_ids"] < 0).sum())
    return arrays, stats
