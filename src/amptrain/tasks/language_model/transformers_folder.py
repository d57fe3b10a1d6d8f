"""A language model trained on a pretrained folder, written back as the folder `transformers`
saves for its family (`amptrain export RUN --format transformers`): what `from_pretrained`,
vLLM, TGI and PEFT load.

    write_folder(task, model, "out/", precision="float32")   # adapters merged first (lora.merge_lora)

The weights go to `model.safetensors` under the names and in the layout of the folder the
run started from: keras-hub's own exporter of the family (`keras_hub.src.utils.transformers.
export`) maps each backbone variable to its `transformers` name, and the names written must be
exactly those of the starting folder's weights (its `lm_head.weight` there or not, as it was):
a difference is refused naming them, before anything is written. `precision`: float32 (the
default), bfloat16 (rounded to nearest even) or float16; above `max_shard_bytes` the weights
are split into numbered files with `model.safetensors.index.json`, as `save_pretrained` does.
Every other file of the starting folder (config.json, the tokenizer's files, the chat
template, generation_config.json) is copied unchanged, config.json with its `dtype` set to
the precision written. The safetensors files are written here (8-byte header length, the JSON
header, the tensors), since `safetensors.numpy` has no bfloat16.
"""

import json
import os
import shutil
import struct

import numpy as np

from amptrain.errors import UserError

# --precision -> (safetensors dtype, the numpy type of its bytes)
PRECISIONS = {"float32": ("F32", "<f4"), "bfloat16": ("BF16", "<u2"), "float16": ("F16", "<f2")}
MAX_SHARD_BYTES = 5 * 1024**3  # transformers' own default shard size
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack", ".gguf")  # of the starting folder: not copied
INDEX_FILE = "model.safetensors.index.json"


def write_export(task, fmt, model, path, precision="float32", quantize=None):
    """`Task.write_export` of the language model: the run's model, its adapters merged, as the
    `transformers` folder `write_folder` writes ("transformers", weights in `precision`), or
    that folder as one llama.cpp GGUF file ("gguf", `quantize`: gguf_files/writer.py) named
    after the run. Returns what the export's record says."""
    from amptrain.gguf_files.writer import write_gguf
    from amptrain.tasks.language_model.base_weights import is_quantized, projection_layers
    from amptrain.tasks.language_model.lora import merge_lora

    if task.checkpoint is None:
        raise UserError(
            f"{task.run_dir}: --format {fmt} writes the folder of a pretrained model's family; this run trained "
            "a model of its own (no model.pretrained): export it as a SavedModel"
        )
    if any(is_quantized(layer) for layer in projection_layers(model)):  # an int8 or int4 base
        model = float_twin(model, task.checkpoint)  # its kernels dequantized, the adapters in
    merge_lora(model)
    if fmt == "transformers":
        return {"tensors": len(write_folder(task, model, path, precision))}
    folder = os.path.join(path, "transformers-folder.partial")
    name = os.path.basename(os.path.abspath(task.run_dir))
    quantize = quantize or "f32"
    file = f"{name}.{quantize.upper()}.gguf"  # llama.cpp's naming: model.Q8_0.gguf
    try:
        write_folder(task, model, folder)
        return {**write_gguf(folder, os.path.join(path, file), quantize, name), "file": file}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_folder(task, model, path, precision="float32", max_shard_bytes=MAX_SHARD_BYTES):
    """Writes `model` (a `PretrainedLanguageModel` of `task`, its adapters merged) into the
    folder `path` (created; what is in it is the caller's to clear) and returns the
    {name: shape} of the weights written."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    source = task.checkpoint.path
    weights = _named_weights(model, _weight_names(source), source)
    os.makedirs(path, exist_ok=True)
    _write_shards(weights, path, precision, max_shard_bytes)
    for name in sorted(os.listdir(source)):
        if name.endswith(WEIGHT_FILES) or name == INDEX_FILE or not os.path.isfile(os.path.join(source, name)):
            continue
        if name == "config.json":
            with open(os.path.join(source, name), encoding="utf-8") as f:
                config = json.load(f)
            config.pop("torch_dtype", None)
            config["dtype"] = precision
            with open(os.path.join(path, name), "w", encoding="utf-8") as f:
                json.dump(config, f, indent=2)
        else:
            shutil.copyfile(os.path.join(source, name), os.path.join(path, name))
    return {name: list(array.shape) for name, array in weights.items()}


def _weight_names(folder):
    """The tensor names of the folder's safetensors weights (one file or an index of shards)."""
    index = os.path.join(folder, INDEX_FILE)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            return set(json.load(f)["weight_map"])
    names = set()
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            with open(os.path.join(folder, name), "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                names |= set(json.loads(f.read(length))) - {"__metadata__"}
    return names


def _named_weights(model, expected, source):
    """{transformers name: float32 array} of the model's backbone, through keras-hub's exporter."""
    from keras_hub.src.utils.transformers.export.hf_exporter import MODEL_EXPORTERS

    backbone = model.backbone
    exporter = MODEL_EXPORTERS.get(type(backbone).__name__)
    if exporter is None:
        raise UserError(f"{source}: keras-hub has no transformers exporter for {type(backbone).__name__}")
    mapped = exporter(backbone, include_lm_head="lm_head.weight" in expected)
    if set(mapped) != expected:
        missing, extra = sorted(expected - set(mapped)), sorted(set(mapped) - expected)
        raise UserError(
            f"{source}: the export's weight names differ from the folder's: missing {missing[:5]}, "
            f"unexpected {extra[:5]}; nothing written"
        )
    return {name: np.asarray(_numpy(value), np.float32) for name, value in sorted(mapped.items())}


def _numpy(value):
    value = value.value if hasattr(value, "value") else value
    return value.numpy() if hasattr(value, "numpy") else value


def _encoded(array, precision):
    """The array's bytes in `precision` (bfloat16: float32 rounded to nearest even, as torch does)."""
    if precision == "bfloat16":
        bits = np.ascontiguousarray(array, np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return np.where(np.isnan(array), 0x7FC0, rounded).astype("<u2").tobytes()
    return np.ascontiguousarray(array.astype(PRECISIONS[precision][1])).tobytes()


def _write_shards(weights, path, precision, max_shard_bytes):
    """model.safetensors, or model-0000i-of-0000n.safetensors and the index above the limit."""
    item = np.dtype(PRECISIONS[precision][1]).itemsize
    shards, current, size = [], {}, 0
    for name, array in weights.items():
        nbytes = array.size * item
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = array
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        _write_safetensors(os.path.join(path, "model.safetensors"), shards[0], precision)
        return
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(os.path.join(path, file), shard, precision)
        weight_map.update({name: file for name in shard})
        total += sum(array.size * item for array in shard.values())
    with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _write_safetensors(path, tensors, precision):
    dtype = PRECISIONS[precision][0]
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, array in tensors.items():
        blob = _encoded(array, precision)
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the tensors start 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


def float_twin(model, checkpoint):
    """A float32 model of the same checkpoint whose projections hold `model`'s computed kernels
    (a quantized base dequantized, the adapters merged): what an export writes of it."""
    from amptrain.tasks.language_model.base_weights import copy_computed_kernels
    from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

    twin = PretrainedLanguageModel(checkpoint, model.max_length, 0.0, "float32")
    copy_computed_kernels(model, twin)
    return twin
