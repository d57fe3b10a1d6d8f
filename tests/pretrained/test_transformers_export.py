"""`amptrain export --format transformers` (tasks/language_model/transformers_folder.py): the
weights written under the starting folder's names and layout, tensor for tensor, for every
causal family; bfloat16 rounded as torch rounds; shards and their index; the refusals. What
`transformers` itself makes of an export is checked in test_transformers_export_runs.py."""

import dataclasses
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
from pretrained.test_families import folder

from amptrain.config import config_from_dict
from amptrain.errors import UserError
from amptrain.tasks import create_task
from amptrain.tasks.language_model.lora import adapters
from amptrain.tasks.language_model.transformers_folder import write_export, write_folder

FAMILIES = ["gpt2", "llama3", "qwen2", "gemma"]
TYPES = {"F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16}


def read_safetensors(path):
    """{name: array} of a safetensors file, read here (numpy's loader has no bfloat16)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    return {
        name: np.frombuffer(data[slice(*entry["data_offsets"])], TYPES[entry["dtype"]]).reshape(entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__"
    }


def lora_task(tmp_path, family, **train):
    text = tmp_path / "train.txt"
    text.write_text("In the beginning God created the heaven and the earth.\n", encoding="utf-8")
    raw = {
        "task": "language_model",
        "data": {"train": str(text), "max_length": 32},
        "model": {"pretrained": folder(family), "dropout": 0.0},
        "train": {"lora_rank": 2, "lora_targets": "query,value,down", **train},
    }
    (tmp_path / "run").mkdir(exist_ok=True)
    task = create_task(config_from_dict(raw, source=str(tmp_path)), str(tmp_path / "run"))
    task.prepare(())
    return task, task.build_model("float32")


@pytest.mark.parametrize("family", FAMILIES)
def test_untrained_adapters_export_the_starting_folder_tensor_for_tensor(tmp_path, family):
    """B starts at zero: merged, every tensor is the folder's own, under its name and shape;
    every other file is copied, config.json with its dtype."""
    task, model = lora_task(tmp_path, family)
    write_export(task, "transformers", model, str(tmp_path / "out"), "float32")
    original = read_safetensors(os.path.join(folder(family), "model.safetensors"))
    written = read_safetensors(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(written) == sorted(original)
    for name, array in original.items():
        assert written[name].shape == array.shape and np.array_equal(written[name], array), name
    copied = sorted(n for n in os.listdir(folder(family)) if not n.endswith(".safetensors"))
    assert sorted(os.listdir(tmp_path / "out")) == sorted(copied + ["model.safetensors"])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config


def test_adapters_are_merged_and_half_precisions_round_to_nearest(tmp_path):
    """Trained adapters change exactly the targeted projections; bfloat16 is float32 rounded
    to nearest even (ml_dtypes, as torch's .to(bfloat16)); float16 numpy's cast."""
    task, model = lora_task(tmp_path, "llama3")
    for variable in adapters(model):
        variable.assign(np.random.default_rng(0).normal(0, 0.3, variable.shape).astype(np.float32))
    write_export(task, "transformers", model, str(tmp_path / "f32"), "float32")
    original = read_safetensors(os.path.join(folder("llama3"), "model.safetensors"))
    merged = read_safetensors(str(tmp_path / "f32" / "model.safetensors"))
    changed = sorted(n for n in original if not np.array_equal(original[n], merged[n]))
    assert changed == [f"model.layers.{i}.{p}" for i in (0, 1) for p in TARGETS]
    for precision, dtype in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
        write_folder(task, model, str(tmp_path / precision), precision)
        half = read_safetensors(str(tmp_path / precision / "model.safetensors"))
        for name, array in merged.items():
            assert np.array_equal(half[name].astype(np.float32), array.astype(dtype).astype(np.float32)), name


TARGETS = ["mlp.down_proj.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight"]


def test_above_the_shard_limit_the_weights_split_with_an_index(tmp_path):
    task, model = lora_task(tmp_path, "qwen2")
    write_folder(task, model, str(tmp_path / "out"), max_shard_bytes=4096)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    together = {}
    for file in files:
        together.update(read_safetensors(str(tmp_path / "out" / file)))
    original = read_safetensors(os.path.join(folder("qwen2"), "model.safetensors"))
    assert sorted(together) == sorted(index["weight_map"]) == sorted(original)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in original.values())
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_precision_or_weight_names_it_cannot_write_are_refused_before_writing(tmp_path):
    """A folder whose weights are named otherwise than keras-hub's exporter names them (here
    the starting folder's header with the token embedding renamed) is refused, naming both."""
    task, model = lora_task(tmp_path, "gpt2")
    with pytest.raises(UserError, match=r"--precision int8: expected one of float32, bfloat16, float16"):
        write_folder(task, model, str(tmp_path / "out"), "int8")
    with open(os.path.join(folder("gpt2"), "model.safetensors"), "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header["transformer.tokens.weight"] = header.pop("transformer.wte.weight")
    encoded = json.dumps(header).encode()
    (tmp_path / "renamed").mkdir()
    (tmp_path / "renamed" / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded)
    task.checkpoint = dataclasses.replace(task.checkpoint, path=str(tmp_path / "renamed"))
    with pytest.raises(
        UserError,
        match=r"renamed: the export's weight names differ from the folder's: missing \['transformer.tokens.weight'\], "
        r"unexpected \['transformer.wte.weight'\]; nothing written",
    ):
        write_folder(task, model, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_export_options_that_do_not_go_together_are_refused_before_anything_is_read(tmp_path):
    import amptrain

    run = str(tmp_path / "no-run")  # never read: the options are checked first
    for options, refusal in (
        ({"fmt": "gguf", "precision": "bfloat16"}, r"--precision bfloat16: for --format transformers or a Saved"),
        ({"fmt": "transformers", "quantize": "q8_0"}, r"--quantize q8_0: for --format gguf; transformers takes"),
        ({"fmt": "gguf", "quantize": "q3"}, r"--quantize q3: expected one of f32, f16, bf16, q8_0, q4_0"),
        ({"fmt": "safetensors"}, r"--format safetensors: unknown export format; expected one of saved_model, onnx"),
    ):
        with pytest.raises(UserError, match=refusal):
            amptrain.export(run, **options)


def test_a_gguf_export_of_a_family_llama_cpp_does_not_read_is_refused_before_the_model_is_rebuilt(tmp_path):
    """A GPT-2 run (no checkpoint, even: nothing is loaded) is refused by its starting folder."""
    import amptrain

    (tmp_path / "train.txt").write_text("In the beginning\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(
        f'task = "language_model"\n[data]\ntrain = "{tmp_path / "train.txt"}"\n'
        f'[model]\npretrained = "{folder("gpt2")}"\n',
        encoding="utf-8",
    )
    with pytest.raises(UserError, match=r"tiny-gpt2/config.json: model_type 'gpt2'; the GGUF export writes the llama"):
        amptrain.export(str(run), fmt="gguf")
    assert sorted(os.listdir(run)) == ["config.toml"]
