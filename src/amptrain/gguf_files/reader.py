"""A GGUF file (llama.cpp's format) read with every count, length, offset and shape checked
against the file before anything is allocated: a file whose header or tensor table lies is
one line naming it and what is wrong, never a huge allocation or a crash deep in numpy.

    gguf = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    gguf.metadata["llama.block_count"]             # 30
    gguf.tensors["blk.0.attn_q.weight"]            # Tensor(name, shape (576, 576), type Q4_1, offset)
    gguf.array("token_embd.weight")                # float32 (49152, 576), dequantized

The layout (github.com/ggml-org/ggml, docs/gguf.md): "GGUF", a version (2 or 3), the tensor
and key-value counts, the key-values (typed; arrays of one type), the tensor infos (name,
dimensions fastest first, type, offset), padding to `general.alignment`, then the tensors'
data. The `gguf` package (llama.cpp's own) gives the block sizes and the dequantization.
"""

import dataclasses
import mmap
import os
import struct

import numpy as np

from amptrain.errors import DataError

# The value types of a key-value (gguf.GGUFValueType): fixed sizes and struct formats.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_DIMS = 4
# Tensor types dequantized here (the ones the `gguf` package dequantizes exactly; the K- and
# I-quants are refused rather than trusted untested).
DEQUANTIZED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple  # numpy's order: (rows, row length); GGUF lists the dimensions the other way round
    type_name: str
    offset: int  # from the start of the file
    nbytes: int


class GGUF:
    """A checked GGUF file: its metadata, its tensor table, and each tensor dequantized on asking."""

    def __init__(self, path, metadata, tensors, buffer):
        self.path, self.metadata, self.tensors, self._buffer = path, metadata, tensors, buffer

    def array(self, name):
        """Tensor `name` as float32, in numpy's order (rows, row length)."""
        import gguf

        tensor = self.tensors[name]
        qtype = gguf.GGMLQuantizationType[tensor.type_name]
        raw = np.frombuffer(self._buffer, np.uint8, tensor.nbytes, tensor.offset)
        rows = int(np.prod(tensor.shape[:-1])) if len(tensor.shape) > 1 else 1
        values = gguf.quants.dequantize(raw.reshape(rows, -1), qtype)
        return np.ascontiguousarray(values, dtype=np.float32).reshape(tensor.shape)


class _Cursor:
    """Reads the header field by field, each read checked against the file's end."""

    def __init__(self, path, buffer):
        self.path, self.buffer, self.at = path, buffer, 0

    def fail(self, what):
        raise DataError(f"{self.path}: {what} (at byte {self.at} of {len(self.buffer)}); expected a whole GGUF file")

    def take(self, size, what):
        if size < 0 or self.at + size > len(self.buffer):
            self.fail(f"{what} runs past the file's end")
        start, self.at = self.at, self.at + size
        return start

    def scalar(self, fmt, what):
        return struct.unpack_from(fmt, self.buffer, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        length = self.scalar("<Q", what)
        start = self.take(length, f"{what} ({length:,} bytes)")
        try:
            return bytes(self.buffer[start : start + length]).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    def count(self, what, smallest_item):
        """A count of items of at least `smallest_item` bytes each, refused if the rest of the
        file cannot hold that many."""
        value = self.scalar("<Q", what)
        if value * smallest_item > len(self.buffer) - self.at:
            self.fail(f"{what} says {value:,}, more than the rest of the file can hold")
        return value

    def value(self, kind, what):
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind == ARRAY:
            item = self.scalar("<I", what)
            if item == ARRAY:
                self.fail(f"{what}: an array of arrays")
            size = struct.calcsize(SCALARS[item]) if item in SCALARS else 8
            n = self.count(f"{what}'s length", size)
            if item in SCALARS:  # read at once: tens of thousands of token types or scores
                start = self.take(n * size, what)
                return np.frombuffer(self.buffer, SCALARS[item], n, start).tolist()
            if item != STRING:
                self.fail(f"{what}: an array of unknown type {item}")
            return [self.string(what) for _ in range(n)]
        self.fail(f"{what}: unknown value type {kind}")


def read_gguf(path):
    """The checked file at `path` (memory-mapped: the tensors are read when asked for)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 24:
                raise DataError(f"{path}: {os.fstat(f.fileno()).st_size} bytes; expected a GGUF file")
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror})") from None
    cursor = _Cursor(path, buffer)
    if bytes(buffer[:4]) != b"GGUF":
        raise DataError(f"{path}: starts with {bytes(buffer[:4])!r}, not b'GGUF'; expected a GGUF file")
    cursor.at = 4
    version = cursor.scalar("<I", "the version")
    if version not in (2, 3):
        cursor.fail(f"version {version}; expected 2 or 3")
    tensor_count = cursor.count("the tensor count", 8 + 4 + 8 + 4 + 8)
    kv_count = cursor.count("the key-value count", 8 + 4 + 1)
    metadata = {}
    for index in range(kv_count):
        key = cursor.string(f"key {index}")
        metadata[key] = cursor.value(cursor.scalar("<I", f"{key}'s type"), key)
    infos = [_tensor_info(cursor, index) for index in range(tensor_count)]
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        cursor.fail(f"general.alignment {alignment!r}; expected a power of two")
    data_start = -(-cursor.at // alignment) * alignment
    tensors = {}
    for name, dims, type_id, offset in infos:
        tensors[name] = _placed(cursor, name, dims, type_id, data_start + offset, alignment)
    return GGUF(path, metadata, tensors, buffer)


def _tensor_info(cursor, index):
    name = cursor.string(f"tensor {index}'s name")
    n_dims = cursor.scalar("<I", f"{name}'s dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        cursor.fail(f"{name}: {n_dims} dimensions; expected 1 to {MAX_DIMS}")
    dims = [cursor.scalar("<Q", f"{name}'s dimensions") for _ in range(n_dims)]
    return name, dims, cursor.scalar("<I", f"{name}'s type"), cursor.scalar("<Q", f"{name}'s offset")


def _placed(cursor, name, dims, type_id, start, alignment):
    """The tensor's entry, its size from its shape and type and its bytes inside the file."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        cursor.fail(f"{name}: unknown tensor type {type_id}")
    if qtype.name not in DEQUANTIZED:
        cursor.fail(f"{name}: tensor type {qtype.name}; this reader dequantizes {', '.join(DEQUANTIZED)}")
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if any(d < 1 for d in dims) or dims[0] % block:
        cursor.fail(f"{name}: dimensions {dims}; expected positive ones, the first a multiple of {block}")
    elements = int(np.prod(np.array(dims, dtype=object)))
    nbytes = elements // block * block_bytes
    if start % alignment or start + nbytes > len(cursor.buffer):
        cursor.fail(f"{name}: {nbytes:,} bytes at offset {start:,} lie past the file's end or off its alignment")
    return Tensor(name, tuple(int(d) for d in reversed(dims)), qtype.name, start, nbytes)
