"""A safetensors weights file's header, checked against the config before any layer is built.

    check_weights(path, expected={"embeddings.word_embeddings.weight": (441, 16)}, num_layers=2)

The header (8 bytes of length, then JSON: {name: {"dtype", "shape", "data_offsets"}}) is
read as data, never run: a header that is not that shape, a weight whose dtype is not a
float one (integers only for the index buffers checkpoints carry, `position_ids`), a byte
size that is not its shape's, a weight missing or of another shape than the config says, a
layer beyond the config's count, or offsets outside the file is one line naming the weight. Names may carry
a prefix (`bert.`, `roberta.`: a checkpoint saved from a task model), as keras-hub accepts.
"""

import json
import os
import re
import struct

from amptrain.errors import ConfigError

MAX_HEADER_BYTES = 100 << 20
DTYPES = ("F32", "F16", "BF16")
# Integer buffers real checkpoints carry beside the weights (BERT's `embeddings.position_ids`):
# the only tensors that may hold integers, and only under these names.
BUFFER_DTYPES = ("I64", "I32")
BUFFER_NAMES = ("position_ids", "token_type_ids")
BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|albert_layer_groups)\.(\d+)\.")


def read_header(path):
    """{name: {"dtype", "shape", "data_offsets"}} of the safetensors file `path`, checked."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ConfigError(f"{path}: not a safetensors file (header length {length}, file {size} bytes)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(f"{path}: the safetensors header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: expected a safetensors header of named tensors, received {type(header).__name__}")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        _check_entry(path, name, entry, size - 8 - length)
    return header


def _check_entry(path, name, entry, data_bytes):
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ConfigError(f"{path}: tensor {name!r}: expected dtype, shape and data_offsets, received {entry!r:.200}")
    buffer = name.rsplit(".", 1)[-1] in BUFFER_NAMES
    known = DTYPES + BUFFER_DTYPES if buffer else DTYPES
    if entry["dtype"] not in known:
        what = "an index buffer" if buffer else "a weight"
        raise ConfigError(
            f"{path}: tensor {name!r}: dtype {entry['dtype']!r:.50}; expected {what} in one of {', '.join(known)}"
        )
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not (isinstance(shape, list) and all(type(n) is int and 0 <= n for n in shape)):
        raise ConfigError(f"{path}: tensor {name!r}: shape {shape!r:.100}; expected a list of sizes")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(n) is int for n in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise ConfigError(
            f"{path}: tensor {name!r}: data_offsets {offsets!r:.100} outside the file's {data_bytes} bytes"
        )
    size = BYTES[entry["dtype"]] * _product(shape)
    if offsets[1] - offsets[0] != size:
        raise ConfigError(
            f"{path}: tensor {name!r}: {offsets[1] - offsets[0]} bytes of data; its shape {shape} "
            f"of {entry['dtype']} needs {size}"
        )


def _product(shape):
    total = 1
    for n in shape:
        total *= n
    return total


def check_weights(path, expected, num_layers):
    """Checks the header of `path` against `expected` ({name: shape}) and that no weight
    belongs to a layer beyond `num_layers`; returns the header."""
    header = read_header(path)
    first = next(iter(expected))
    prefixes = [name[: -len(first)] for name in header if name.endswith(first)]
    prefix = min(prefixes, key=len) if prefixes else ""
    for name, shape in expected.items():
        entry = header.get(prefix + name)
        if entry is None:
            raise ConfigError(f"{path}: no weight {prefix + name!r}; expected one of shape {list(shape)} (config.json)")
        if tuple(entry["shape"]) != tuple(shape):
            raise ConfigError(
                f"{path}: weight {prefix + name!r} has shape {entry['shape']}, but config.json says {list(shape)}"
            )
    for name in header:
        match = LAYER_INDEX.search(name)
        if match and "albert_layer_groups" not in match.group(0) and int(match.group(1)) >= num_layers:
            raise ConfigError(f"{path}: weight {name!r} of a layer beyond config.json's {num_layers}")
    return header


def read_tensor(path, name):
    """The weight `name` (with any prefix) of the safetensors file `path`, as numpy."""
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        (key,) = [k for k in f.keys() if k == name or k.endswith("." + name)][:1]
        return f.get_tensor(key)
