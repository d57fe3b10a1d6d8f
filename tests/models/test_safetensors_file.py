"""The weights of a `transformers` folder read a tensor at a time from the file (no memory
map): float32 and bfloat16 tensors as written, and a truncated or foreign file refused with
its path and the tensor's name."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from amptrain.models.families.loading import SafetensorsFile


def write(path, tensors, cut=0, dtype_names=None):
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = array.astype(array.dtype.newbyteorder("<")).tobytes()
        kind = (dtype_names or {}).get(name) or {"float32": "F32", "bfloat16": "BF16", "int64": "I64"}[array.dtype.name]
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    body = struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)
    path.write_bytes(body[: len(body) - cut])


def test_tensors_read_back_as_written(tmp_path):
    weights = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    halves = (np.arange(6, dtype=np.float32) - 2.5).astype(ml_dtypes.bfloat16).reshape(2, 3)
    write(tmp_path / "model.safetensors", {"a.weight": weights, "b.weight": halves, "ids": np.arange(3)})
    file = SafetensorsFile(str(tmp_path / "model.safetensors"))
    assert sorted(file.keys()) == ["a.weight", "b.weight", "ids"]
    assert np.array_equal(file.get_tensor("a.weight"), weights)
    read = file.get_tensor("b.weight")
    assert read.dtype == ml_dtypes.bfloat16 and np.array_equal(read.astype(np.float32), halves.astype(np.float32))
    assert file.get_tensor("ids").tolist() == [0, 1, 2]
    file.file.close()


def test_a_truncated_file_or_an_unknown_dtype_is_refused_with_the_tensor(tmp_path):
    write(tmp_path / "cut.safetensors", {"a.weight": np.ones((4, 4), np.float32)}, cut=8)
    file = SafetensorsFile(str(tmp_path / "cut.safetensors"))
    with pytest.raises(ValueError, match=r"cut.safetensors: tensor a.weight: the file ends before its 64 bytes"):
        file.get_tensor("a.weight")
    file.file.close()
    write(tmp_path / "f8.safetensors", {"w": np.ones(2, np.float32)}, dtype_names={"w": "F8_E4M3"})
    file = SafetensorsFile(str(tmp_path / "f8.safetensors"))
    with pytest.raises(ValueError, match=r"f8.safetensors: tensor w: dtype F8_E4M3 is not one amptrain reads"):
        file.get_tensor("w")
    file.file.close()
