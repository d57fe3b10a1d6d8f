"""OpenAI's requests read and refused as OpenAI would, and a reply's text given out as it
becomes final (held back while it may still be a stop string or half a character): no model."""

import json

import pytest

from amptrain.serving.openai_api import OpenAIError, ReplyText, check_context, parse_request
from amptrain.serving.rest import Limits

LIMITS = Limits()
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hola"}]}


def parse(document, kind="chat", limits=LIMITS):
    return parse_request(json.dumps(document).encode(), kind, "m", limits)


def refusal(document, kind="chat", limits=LIMITS):
    with pytest.raises(OpenAIError) as raised:
        parse(document, kind, limits)
    return raised.value


def test_a_chat_request_takes_openais_defaults_and_text_parts():
    request = parse(CHAT)
    assert (request.max_tokens, request.temperature, request.top_p, request.seed) == (None, 1.0, 1.0, None)
    assert request.stop == () and not request.stream and not request.include_usage
    parts = {"role": "user", "content": [{"type": "text", "text": "Ho"}, {"type": "text", "text": "la"}]}
    request = parse({**CHAT, "messages": [parts], "max_completion_tokens": 7, "stop": "\n", "stream": True,
                     "stream_options": {"include_usage": True}, "n": 1, "temperature": 0})  # fmt: skip
    assert request.messages == [{"role": "user", "content": "Hola"}]
    assert (request.max_tokens, request.temperature, request.stop, request.include_usage) == (7, 0.0, ("\n",), True)
    completion = parse({"model": "m", "prompt": ["In the beginning"]}, "completions")
    assert (completion.prompt, completion.max_tokens, completion.messages) == ("In the beginning", 16, None)


@pytest.mark.parametrize(
    "change, param, words",
    [
        ({"model": "gpt-4o"}, "model", "does not exist; this server serves 'm'"),
        ({"messages": []}, "messages", "at least one message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]", "expected one of"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content", "text only"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "expected a string"),
        ({"max_tokens": 0}, "max_tokens", "an integer >= 1"),
        ({"max_tokens": True}, "max_tokens", "an integer >= 1"),
        ({"temperature": 2.5}, "temperature", "from 0.0 to 2.0"),
        ({"top_p": 0}, "top_p", "from 0.0 to 1.0"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": [""]}, "stop", "non-empty string"),
        ({"n": 2}, "n", "only 1 is supported"),
        ({"tools": []}, "tools", "unsupported parameter 'tools'"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"seed": 2**64}, "seed", "64-bit integer"),
    ],
)
def test_a_malformed_request_names_its_parameter(change, param, words):
    error = refusal({**CHAT, **change})
    assert error.status == (404 if param == "model" else 400) and error.param == param and words in str(error)
    assert error.body()["error"]["type"] == "invalid_request_error" and error.body()["error"]["message"] == str(error)


def test_bodies_that_are_no_request_are_400_or_413():
    assert refusal({"messages": CHAT["messages"]}).code == "missing_required_parameter"
    with pytest.raises(OpenAIError, match="not JSON") as raised:
        parse_request(b"{", "chat", "m", Limits())
    assert raised.value.status == 400
    with pytest.raises(OpenAIError) as raised:
        parse_request(json.dumps(CHAT).encode(), "chat", "m", Limits(max_body_bytes=10))
    assert raised.value.status == 413
    assert "at most 3 (--max-text-chars)" in str(refusal(CHAT, limits=Limits(max_text_chars=3)))
    assert "lone surrogate" in str(refusal({**CHAT, "messages": [{"role": "user", "content": "\ud800"}]}))
    assert "one prompt a request" in str(refusal({"model": "m", "prompt": ["a", "b"]}, "completions"))


def test_the_context_bounds_the_new_pieces():
    assert check_context(10, None, 128) == 118  # all the context leaves
    assert check_context(10, 118, 128) == 118
    with pytest.raises(OpenAIError, match=r"maximum context length is 128 tokens.*129 tokens \(10 in the prompt"):
        check_context(10, 119, 128)
    with pytest.raises(OpenAIError) as raised:
        check_context(128, None, 128)
    assert raised.value.code == "context_length_exceeded" and raised.value.param == "messages"


def pieces_of(text):
    """A 'tokenizer' whose pieces are UTF-8 bytes: a character may take several."""
    return list(text.encode("utf-8"))


def decode(pieces):
    return bytes(pieces).decode("utf-8", "replace")


def stream(text, stops=()):
    reply = ReplyText(decode, stops)
    sent = []
    for piece in pieces_of(text):
        sent.append(reply.add(piece))
        if reply.stopped:
            break
    return sent, reply.finish(), reply


def test_text_goes_out_whole_characters_at_a_time():
    sent, rest, reply = stream("añ🙂")
    assert sent == ["a", "", "ñ", "", "", "", "🙂"] and rest == "" and reply.text == "añ🙂"


def test_a_stop_string_ends_the_text_before_it_and_is_held_back_until_decided():
    sent, rest, reply = stream("Hola.\nUser: more", stops=["\nUser:"])
    assert "".join(sent) + rest == "Hola." and reply.stopped and reply.text == "Hola."
    assert all("\n" not in part for part in sent)  # never sent, though it began a stop string
    sent, rest, reply = stream("a\nb", stops=["\nUser:"])
    assert "".join(sent) == "" and rest == "a\nb" and not reply.stopped  # held back while it might still stop
