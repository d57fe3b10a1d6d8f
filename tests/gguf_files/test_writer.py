"""A Llama `transformers` folder written as GGUF (amptrain/gguf_files/writer.py) and read back
by amptrain's own reader: the tensors as they were (f32 exactly, q8_0 within a block's step),
the tokenizer tokenizing alike, the special pieces and the chat template kept; the folders it
cannot write refused in one line. The folder is tiny-llama3 with RoPE unscaled and SmolLM2's
pre-tokenizer (what the writer names); what llama.cpp's readers make of a real export is in
tests/pretrained/test_transformers_export_runs.py."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from amptrain.errors import UserError
from amptrain.gguf_files.folder import write_folder
from amptrain.gguf_files.reader import read_gguf
from amptrain.gguf_files.writer import write_gguf

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pretrained")
TEXTS = ["In the beginning 1234 God", "Café 🙂 and\tthe light", "<|begin_of_text|>twice"]
SMOLLM_SPLIT = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}


@pytest.fixture
def llama(tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(os.path.join(TINY, "tiny-llama3"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = SMOLLM_SPLIT
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def test_f32_reads_back_tensor_for_tensor_with_its_tokenizer(llama, tmp_path):
    written = write_gguf(str(llama), str(tmp_path / "m.gguf"), "f32")
    assert written == {"tensors": 2 * 9 + 3, "quantize": "f32"}  # two layers, embeddings, norm, untied output
    meta = read_gguf(str(tmp_path / "m.gguf")).metadata
    assert meta["general.architecture"] == "llama" and meta["tokenizer.ggml.pre"] == "smollm"
    assert meta["tokenizer.chat_template"] == (llama / "chat_template.jinja").read_text()
    config = json.loads((llama / "config.json").read_text())
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (398, 399)
    assert meta["llama.rope.freq_base"] == 500000.0 and meta["llama.attention.head_count_kv"] == 1
    back = tmp_path / "back"
    write_folder(str(tmp_path / "m.gguf"), str(back))
    original, read = load_file(str(llama / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert sorted(read) == sorted(original)
    for name, array in original.items():
        assert np.array_equal(read[name], array), name
    ours, theirs = Tokenizer.from_file(str(back / "tokenizer.json")), Tokenizer.from_file(str(llama / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text).ids == theirs.encode(text).ids, text
    assert json.loads((back / "config.json").read_text())["vocab_size"] == config["vocab_size"]


def test_q8_0_matrices_come_back_within_a_blocks_step(llama, tmp_path):
    """Rows of 32 (the down projection's) are q8_0 blocks; rows of 16 are not whole blocks
    and go f16; the norms stay f32."""
    write_gguf(str(llama), str(tmp_path / "q.gguf"), "q8_0")
    file = read_gguf(str(tmp_path / "q.gguf"))
    kinds = {name: tensor.type_name for name, tensor in file.tensors.items()}
    assert (kinds["blk.0.ffn_down.weight"], kinds["blk.0.attn_q.weight"], kinds["blk.0.attn_norm.weight"]) == (
        "Q8_0",
        "F16",
        "F32",
    )
    original = load_file(str(llama / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    back = file.array("blk.0.ffn_down.weight")
    step = np.abs(original).reshape(original.shape[0], -1, 32).max(axis=-1, keepdims=True) / 127
    # half a step, and the scale's own float16 rounding times the largest multiple (127 * 2^-11 steps)
    assert (np.abs(back - original).reshape(step.shape[0], -1, 32) <= step * (0.5 + 127 / 2048)).all()


def test_folders_llama_cpp_would_not_run_as_written_are_refused(llama, tmp_path):
    with pytest.raises(UserError, match=r"tiny-gpt2/config.json: model_type 'gpt2'; the GGUF export writes the llama"):
        write_gguf(os.path.join(TINY, "tiny-gpt2"), str(tmp_path / "a.gguf"))
    with pytest.raises(UserError, match=r"tiny-llama3/config.json: RoPE scaling 'llama3'; the GGUF export writes"):
        write_gguf(os.path.join(TINY, "tiny-llama3"), str(tmp_path / "b.gguf"))
    shutil.copyfile(os.path.join(TINY, "tiny-llama3", "tokenizer.json"), llama / "tokenizer.json")
    with pytest.raises(UserError, match=r"tokenizer.json: a pre-tokenizer llama.cpp has no name for here"):
        write_gguf(str(llama), str(tmp_path / "c.gguf"))
    with pytest.raises(UserError, match=r"--quantize q2_k: expected one of f32, f16, bf16, q8_0, q4_0"):
        write_gguf(str(llama), str(tmp_path / "d.gguf"), "q2_k")
