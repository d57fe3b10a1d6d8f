"""A predict request for a token-ids signature (`serve_token_ids`: integer tensors in, for
callers that tokenize themselves), as TF Serving reads it: rows (`instances`, a list of
objects `{input: nested list}`, or of nested lists when there is one input) or columns
(`inputs`, `{input: nested list}`, or a nested list for one input).

    parse_tensors([{"token_ids": [2, 5659, 6627]}], {"token_ids": (None, None)}, columnar=False, limits)
    # {"token_ids": array([[2, 5659, 6627]], dtype=int32)}

Each input must be a rectangular array of whole numbers of its signature's rank and fixed
sizes, all inputs with the same number of rows. These requests are not batched with others
(their lengths differ); each is one call in the model's thread.
"""

import numpy as np

INT32 = np.iinfo(np.int32)


class BadRequest(ValueError):
    """A request refused with a 4xx status (`status`) and a one-line reason."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def parse_tensors(value, specs, columnar, limits):
    """{input name: int32 array} of a request's `instances` or `inputs` for a signature
    whose inputs are `specs` ({name: shape, None for any size})."""
    names = list(specs)
    columns = _columns(value, names) if columnar else _rows(value, names)
    if set(columns) != set(names):
        raise BadRequest(f"inputs {sorted(columns)}; this signature takes {names}")
    arrays = {name: _int_array(name, columns[name], specs[name]) for name in names}
    rows = {len(a) for a in arrays.values()}
    if len(rows) != 1:
        raise BadRequest(f"the inputs have different numbers of rows {sorted(rows)}; expected one")
    (count,) = rows
    if count == 0:
        raise BadRequest("no instances; expected at least one")
    if count > limits.max_instances:
        raise BadRequest(f"{count} instances; at most {limits.max_instances} a request (--max-instances)", 413)
    return arrays


def _columns(value, names):
    if isinstance(value, dict):
        return value
    if len(names) == 1:
        return {names[0]: value}
    raise BadRequest(f'"inputs" is a JSON {type(value).__name__}; expected an object with {names}')


def _rows(value, names):
    if not isinstance(value, list):
        raise BadRequest(f'"instances" is a JSON {type(value).__name__}; expected a list')
    if len(names) == 1 and not any(isinstance(row, dict) for row in value):
        return {names[0]: value}
    for i, row in enumerate(value):
        if not isinstance(row, dict) or set(row) != set(names):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise BadRequest(f"instances[{i}] is {keys}; expected an object with {names}")
    return {name: [row[name] for row in value] for name in names}


def _int_array(name, value, shape):
    try:
        array = np.asarray(value)
    except ValueError:  # numpy refuses a ragged list
        raise BadRequest(f"{name}: rows of different lengths; expected a rectangular array (pad with 0)") from None
    if array.dtype.kind not in "iu" and not (array.dtype.kind == "f" and array.size == 0):
        raise BadRequest(f"{name}: {array.dtype.kind!r} values; expected whole numbers (token ids)")
    if array.ndim != len(shape) or any(want is not None and got != want for got, want in zip(array.shape, shape)):
        expected = ", ".join("any" if d is None else str(d) for d in shape)
        raise BadRequest(f"{name}: shape {list(array.shape)}; expected ({expected})")
    if array.size and (array.min() < INT32.min or array.max() > INT32.max):
        raise BadRequest(f"{name}: a value outside int32")
    return array.astype(np.int32)
