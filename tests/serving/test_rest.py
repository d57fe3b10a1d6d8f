"""TF Serving's REST request and response (serving/rest.py): both formats, every bad input
refused with its status and one line, the limits."""

import json
import re

import numpy as np
import pytest

from amptrain.serving.rest import BadRequest, Limits, format_predictions, parse_predict

LIMITS = Limits(max_body_bytes=1000, max_instances=3, max_text_chars=5)
IDS = {"serve_token_ids": {"token_ids": (None, None)}}
TAGGER_IDS = {"serve_token_ids": {"token_ids": (None, None), "char_ids": (None, None, 2)}}


def parse(document, limits=LIMITS, signatures=IDS):
    return parse_predict(document if isinstance(document, bytes) else json.dumps(document).encode(), limits, signatures)


@pytest.mark.parametrize(
    "document, columnar",
    [
        ({"instances": ["a", "b"]}, False),
        ({"instances": [{"text": "a"}, {"text": "b"}], "signature_name": "serving_default"}, False),
        ({"inputs": ["a", "b"]}, True),
        ({"inputs": {"text": ["a", "b"]}}, True),
    ],
)
def test_rows_and_columns_give_the_texts(document, columnar):
    request = parse(document)
    assert request.texts == ["a", "b"] and request.columnar is columnar


def test_a_long_text_is_cut_not_refused():
    assert parse({"instances": ["abcdefgh", "é😀"]}).texts == ["abcde", "é😀"]


@pytest.mark.parametrize(
    "body, status, says",
    [
        (b"not json", 400, "not JSON"),
        (b'{"instances": ["\xff"]}', 400, "not valid UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nests JSON too deeply"),
        (b'["a"]', 400, "JSON list; expected an object"),
        (b'{"instance": ["a"]}', 400, "unknown field 'instance'"),
        (b'{"instances": ["a"], "inputs": ["a"]}', 400, "exactly one of"),
        (b"{}", 400, "exactly one of"),
        (b'{"instances": "a"}', 400, "expected a list of strings"),
        (b'{"instances": ["a", 1]}', 400, "instances[1] is a JSON int"),
        (b'{"instances": [["a"]]}', 400, "instances[0] is a JSON list"),
        (b'{"instances": [{"txt": "a"}]}', 400, "expected only 'text'"),
        (b'{"inputs": {"text": [null]}}', 400, "inputs[0] is a JSON NoneType"),
        (b'{"inputs": {"token_ids": [[1]]}}', 400, "expected only 'text'"),
        (b'{"instances": []}', 400, "no instances"),
        (b'{"instances": ["ok", "a\\ud800b"]}', 400, "instances[1] holds U+D800 at character 1, a lone surrogate"),
        (b'{"inputs": {"text": ["\\udfff"]}}', 400, "inputs[0] holds U+DFFF at character 0"),
        (b'{"instances": ["\\ud83d\\ude00"]}', None, None),  # a surrogate pair: one character, accepted
        (b'{"instances": ["a"], "signature_name": "serve_ids"}', 400, "'serve_ids' not found; this model has"),
        (b'{"instances": ["a", "b", "c", "d"]}', 413, "4 instances; at most 3"),
        (b'{"instances": ["' + b"a" * 2000 + b'"]}', 413, "at most 1000 (--max-body-bytes)"),
    ],
)
def test_a_bad_request_is_one_line_and_its_status(body, status, says):
    if status is None:
        assert parse(body, Limits()).texts == ["\U0001f600"]
        return
    with pytest.raises(BadRequest) as raised:
        parse(body, Limits(max_body_bytes=1000 if b"a" * 2000 in body else 10**7, max_instances=3))
    assert raised.value.status == status and says in str(raised.value) and "\n" not in str(raised.value)


def test_responses_in_rows_and_in_columns():
    outputs = {"label": np.array([b"ham", "sp\u00e4m".encode()], dtype=object), "probabilities": np.eye(2, dtype="f4")}
    assert format_predictions(outputs, columnar=False) == {
        "predictions": [{"label": "ham", "probabilities": [1.0, 0.0]}, {"label": "späm", "probabilities": [0.0, 1.0]}]
    }
    assert format_predictions(outputs, columnar=True) == {
        "outputs": {"label": ["ham", "späm"], "probabilities": [[1.0, 0.0], [0.0, 1.0]]}
    }
    assert json.dumps(format_predictions({"num_words": np.array([3, 0], "i4"), "tags": np.array([b"O", b"O"])}, False))


def test_one_output_is_given_without_its_name():
    outputs = {"translation": np.array([b"hola", b""], dtype=object)}
    assert format_predictions(outputs, columnar=False) == {"predictions": ["hola", ""]}
    assert format_predictions(outputs, columnar=True) == {"outputs": ["hola", ""]}


@pytest.mark.parametrize(
    "document, signatures",
    [
        ({"instances": [{"token_ids": [2, 5, 6]}, {"token_ids": [2, 7, 0]}]}, IDS),
        ({"instances": [[2, 5, 6], [2, 7, 0]]}, IDS),
        ({"inputs": {"token_ids": [[2, 5, 6], [2, 7, 0]]}}, IDS),
        ({"inputs": [[2, 5, 6], [2, 7, 0]]}, IDS),
    ],
)
def test_a_token_ids_request_gives_int32_arrays(document, signatures):
    request = parse({**document, "signature_name": "serve_token_ids"}, Limits())
    assert request.texts is None and request.signature == "serve_token_ids"
    assert request.tensors["token_ids"].dtype == np.int32 and request.tensors["token_ids"].tolist() == [
        [2, 5, 6],
        [2, 7, 0],
    ]


@pytest.mark.parametrize(
    "value, signatures, says",
    [
        ({"instances": [[2, 5], [2]]}, IDS, "rows of different lengths"),
        ({"instances": [[2.5, 1.0]]}, IDS, "expected whole numbers"),
        ({"instances": [["a"]]}, IDS, "expected whole numbers"),
        ({"instances": [2, 5]}, IDS, "shape [2]; expected (any, any)"),
        ({"instances": [[2**40]]}, IDS, "outside int32"),
        ({"inputs": {"token_ids": [[1]], "char_ids": [[[1, 2]], [[1, 2]]]}}, TAGGER_IDS, "different numbers of rows"),
        (
            {"inputs": {"token_ids": [[1]], "char_ids": [[[1, 2, 3]]]}},
            TAGGER_IDS,
            "shape [1, 1, 3]; expected (any, any, 2)",
        ),
        ({"instances": [{"token_ids": [1]}]}, TAGGER_IDS, "expected an object with ['token_ids', 'char_ids']"),
        ({"inputs": [[1]]}, TAGGER_IDS, "expected an object with"),
        ({"inputs": {"token_ids": []}}, IDS, "token_ids: shape [0]; expected (any, any)"),
    ],
)
def test_a_bad_token_ids_request_is_one_line(value, signatures, says):
    with pytest.raises(BadRequest, match=re.escape(says)):
        parse({**value, "signature_name": "serve_token_ids"}, Limits(), signatures)
