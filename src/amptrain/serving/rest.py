"""TF Serving's REST predict request and response, for an export's `serving_default`
(one string input, `text`; a token-ids signature's request is `tensors.py`'s): pure
logic, no server, no TensorFlow.

    request = parse_predict(b'{"instances": ["see you at lunch"]}', Limits())
    request.texts, request.columnar      # ["see you at lunch"], False
    format_predictions(outputs, columnar=False)   # {"predictions": [{"label": ..., ...}]}

The two formats are TF Serving's: rows (`instances`: a list of strings, or of objects
`{"text": ...}`) answered as `{"predictions": [one object of named outputs a row]}`;
columns (`inputs`: a list of strings, or `{"text": [...]}`) answered as
`{"outputs": {name: [a value a row]}}`; a signature of one output (the translator's) gives
its values without its name. A bad request raises `BadRequest` with the one
line TF Serving would put in `{"error": ...}`.
"""

import json
from dataclasses import dataclass

import numpy as np

from amptrain.serving.tensors import BadRequest, parse_tensors

INPUT = "text"  # the name of `serving_default`'s one input (classification, ner, translation)
SIGNATURE = "serving_default"


@dataclass(frozen=True)
class Limits:
    """What one request may hold: its body in bytes, its instances, and a text's characters
    (a longer text is cut to its first `max_text_chars`, as training cuts to `data.max_length`
    pieces, which come after far fewer characters); and how long a client may take to send
    its request line and headers, then its body (a slow client holds a connection)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_instances: int = 1024
    max_text_chars: int = 10_000
    header_seconds: float = 10.0
    body_seconds: float = 30.0


@dataclass(frozen=True)
class PredictRequest:
    texts: list | None  # `serving_default`'s
    columnar: bool  # `inputs` in, `outputs` out
    signature: str = SIGNATURE
    tensors: dict | None = None  # another signature's inputs {name: int32 array} (tensors.py)


def parse_predict(body, limits, id_signatures=None):
    """The texts of a predict request's body (bytes), checked against `limits`; or, for a
    token-ids signature named in `id_signatures` ({name: {input: shape}}), its tensors."""
    document = json_object(body, limits)
    signature = document.get("signature_name", SIGNATURE)
    unknown = sorted(set(document) - {"instances", "inputs", "signature_name"})
    if unknown:
        raise BadRequest(f'unknown field {unknown[0]!r}; expected "instances" or "inputs" and "signature_name"')
    if ("instances" in document) == ("inputs" in document):
        raise BadRequest('expected exactly one of "instances" (rows) or "inputs" (columns)')
    columnar = "inputs" in document
    value = document["inputs" if columnar else "instances"]
    if signature != SIGNATURE:
        if signature not in (id_signatures or {}):
            known = [SIGNATURE, *(id_signatures or {})]
            raise BadRequest(f"signature_name {signature!r} not found; this model has {known}")
        return PredictRequest(
            None, columnar, signature, parse_tensors(value, id_signatures[signature], columnar, limits)
        )
    texts = _column(value) if columnar else _rows(value)
    if not texts:
        raise BadRequest("no instances; expected at least one string")
    if len(texts) > limits.max_instances:
        raise BadRequest(f"{len(texts)} instances; at most {limits.max_instances} a request (--max-instances)", 413)
    return PredictRequest([t[: limits.max_text_chars] for t in texts], columnar)


def json_object(body, limits):
    """The body's JSON object."""
    if len(body) > limits.max_body_bytes:
        raise BadRequest(f"request body of {len(body)} bytes; at most {limits.max_body_bytes} (--max-body-bytes)", 413)
    try:
        document = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise BadRequest(f"request body is not valid UTF-8 (byte {error.start}); expected a JSON object") from None
    except RecursionError:
        raise BadRequest('request body nests JSON too deeply; expected {"instances": [strings]}') from None
    except ValueError as error:
        raise BadRequest(f'request body is not JSON ({error}); expected {{"instances": [strings]}}') from None
    if not isinstance(document, dict):
        raise BadRequest(f'request body is a JSON {type(document).__name__}; expected an object with "instances"')
    return document


def _rows(instances):
    if not isinstance(instances, list):
        raise BadRequest(f'"instances" is a JSON {type(instances).__name__}; expected a list of strings')
    texts = []
    for i, instance in enumerate(instances):
        if isinstance(instance, dict):
            if set(instance) != {INPUT}:
                raise BadRequest(f"instances[{i}] has keys {sorted(instance)}; expected only {INPUT!r}")
            instance = instance[INPUT]
        if not isinstance(instance, str):
            raise BadRequest(f"instances[{i}] is a JSON {type(instance).__name__}; expected a string")
        texts.append(utf8_text(instance, f"instances[{i}]"))
    return texts


def _column(inputs):
    if isinstance(inputs, dict):
        if set(inputs) != {INPUT}:
            raise BadRequest(f'"inputs" has keys {sorted(inputs)}; expected only {INPUT!r}')
        inputs = inputs[INPUT]
    if isinstance(inputs, str):
        inputs = [inputs]  # TF Serving reads a scalar input as one row
    if not isinstance(inputs, list):
        raise BadRequest(f'"inputs" is a JSON {type(inputs).__name__}; expected a list of strings')
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            raise BadRequest(f"inputs[{i}] is a JSON {type(text).__name__}; expected a string")
        utf8_text(text, f"inputs[{i}]")
    return inputs


def utf8_text(text, where):
    """`text` if it is Unicode text UTF-8 can carry. JSON's escapes can spell a lone
    surrogate ("\\ud800"), which no UTF-8 text holds: refused here, in its own request, before
    it could join a batch whose conversion it would fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise BadRequest(
            f"{where} holds U+{code:04X} at character {error.start}, a lone surrogate no UTF-8 text has; "
            "expected Unicode text (a surrogate pair spells one character)"
        ) from None
    return text


def format_predictions(outputs, columnar):
    """The response of a request's outputs ({name: array, a row a text}), as TF Serving
    writes it: strings as UTF-8 text, numbers as JSON numbers."""
    lists = {name: _json_value(array) for name, array in outputs.items()}
    if len(lists) == 1:  # one output (the translator's): its values, without its name
        (values,) = lists.values()
        return {"outputs": values} if columnar else {"predictions": values}
    if columnar:
        return {"outputs": lists}
    rows = len(next(iter(lists.values()))) if lists else 0
    return {"predictions": [{name: values[i] for name, values in lists.items()} for i in range(rows)]}


def _json_value(array):
    array = np.asarray(array)
    if array.dtype.kind in "SO":
        return np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array).tolist()
    return array.tolist()
