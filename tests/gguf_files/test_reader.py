"""GGUF files read and converted to the folder amptrain loads (amptrain/gguf_files/), on a
tiny GGUF written here with the `gguf` package's own writer, as llama.cpp's converter lays a
Llama out: the tiny Llama's weights with the query and key rows permuted, in F32, Q8_0 and
Q4_1; the tiny GPT-2's byte-level BPE as the vocabulary. A file whose header or tensor table
lies is one line naming it, before anything is allocated."""

import json
import os
import shutil
import struct

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from amptrain.config.pretrained import read_checkpoint
from amptrain.errors import DataError
from amptrain.gguf_files.folder import cached_folder, write_folder
from amptrain.gguf_files.reader import read_gguf

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pretrained")
LAYERS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(weights, heads):
    """What llama.cpp's converter does to a query or key projection (its `permute`)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_name(name):
    """transformers' tensor name -> GGUF's."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if name in fixed or name == "lm_head.weight":
        return fixed.get(name, "output.weight")
    _, _, layer, rest = name.split(".", 3)
    part, _, kind = rest.rpartition(".")
    return f"blk.{layer}.{LAYERS[part]}.{kind}"


def write_tiny_gguf(path, qtype="F32", pre="gpt-2"):
    """The tiny Llama (32 positions, no RoPE scaling) with the tiny GPT-2's vocabulary, as a GGUF."""
    config = json.load(open(os.path.join(TINY, "tiny-llama3", "config.json")))
    weights = load_file(os.path.join(TINY, "tiny-llama3", "model.safetensors"))
    vocabulary = json.load(open(os.path.join(TINY, "tiny-gpt2", "tokenizer.json")))["model"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(32)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    tokens = [*sorted(vocabulary["vocab"], key=vocabulary["vocab"].get), "<|endoftext|>"]  # its added piece: 399
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in vocabulary["merges"]])
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for name, values in weights.items():
        heads = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
        if "q_proj" in name or "k_proj" in name:
            values = llama_cpp_permute(values, heads)
        blocks = values.ndim == 2 and values.shape[-1] % 32 == 0  # the down projections' rows (32 wide)
        kind = gguf.GGMLQuantizationType[qtype if blocks else "F32"]
        data = gguf.quants.quantize(values.astype(np.float32), kind)
        writer.add_tensor(gguf_name(name), data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def test_the_folder_holds_the_weights_in_transformers_order(tiny_gguf, tmp_path):
    path, weights = tiny_gguf
    folder = write_folder(str(path), str(tmp_path / "folder"))
    converted = load_file(os.path.join(folder, "model.safetensors"))
    assert sorted(converted) == sorted(weights)
    for name, values in weights.items():  # F32: exact, the permutation undone
        np.testing.assert_array_equal(converted[name], values, err_msg=name)
    config = json.load(open(os.path.join(folder, "config.json")))
    assert (config["num_key_value_heads"], config["tie_word_embeddings"], config["vocab_size"]) == (1, False, 400)
    assert config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert open(os.path.join(folder, "chat_template.jinja")).read().startswith("{% for m in messages %}")


@pytest.mark.parametrize("qtype, bound", [("Q8_0", 0.02), ("Q4_1", 0.2)])
def test_quantized_tensors_come_back_within_their_step(tmp_path, qtype, bound):
    weights = write_tiny_gguf(tmp_path / "q.gguf", qtype)
    gguf_file = read_gguf(str(tmp_path / "q.gguf"))
    values = gguf_file.array("blk.0.ffn_down.weight")  # (16, 32): one block of 32 a row
    original = weights["model.layers.0.mlp.down_proj.weight"]
    assert values.shape == original.shape and gguf_file.tensors["blk.0.ffn_down.weight"].type_name == qtype
    step = np.abs(original).max() * bound
    assert 0 < np.abs(values - original).max() < step


def test_the_vocabulary_tokenizes_as_the_models_own(tiny_gguf, tmp_path):
    """The tiny GPT-2's byte-level BPE through the GGUF's tokens and merges gives its ids."""
    from tokenizers import Tokenizer

    folder = write_folder(str(tiny_gguf[0]), str(tmp_path / "folder"))
    ours = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    theirs = Tokenizer.from_file(os.path.join(TINY, "tiny-gpt2", "tokenizer.json"))
    for text in ["In the beginning God created", "  spaces, tabs\tand 12345 digits", "héllo wörld ✓<|endoftext|>"]:
        assert ours.encode(text).ids == theirs.encode(text).ids, text
    assert ours.token_to_id("<|endoftext|>") == 399
    assert ours.decode(ours.encode("In the beginning").ids) == "In the beginning"


def test_model_pretrained_may_name_the_gguf_file(tiny_gguf, tmp_path, monkeypatch):
    """Converted once into the per-user cache, under the file's SHA-256; another file, another folder."""
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    checkpoint = read_checkpoint(str(tiny_gguf[0]))
    assert checkpoint.model_type == "llama" and checkpoint.kind == "causal" and checkpoint.num_layers == 2
    assert cached_folder(str(tiny_gguf[0])) == checkpoint.path and checkpoint.path.startswith(str(tmp_path / "cache"))
    copy = tmp_path / "changed.gguf"
    shutil.copy(tiny_gguf[0], copy)
    with open(copy, "r+b") as f:  # one weight changed, the header the same
        f.seek(-4, os.SEEK_END)
        f.write(struct.pack("<f", 0.5))
    assert cached_folder(str(copy)) != checkpoint.path


def lying(path, tmp_path, at, value, fmt="<Q"):
    """A copy of the tiny GGUF with `value` written at byte `at`."""
    bad = tmp_path / f"bad-{at}.gguf"
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, at, value)
    bad.write_bytes(bytes(data))
    return str(bad)


def test_a_file_whose_header_lies_is_one_line(tiny_gguf, tmp_path):
    path = tiny_gguf[0]
    cases = [
        (8, 1 << 40, r"the tensor count says 1,099,511,627,776, more than the rest of the file can hold"),
        (16, 1 << 50, r"the key-value count says .*, more than the rest of the file can hold"),
        (24, 1 << 40, r"key 0 \(1,099,511,627,776 bytes\) runs past the file's end"),
        (4, 9, r"version 9; expected 2 or 3"),
    ]
    for at, value, message in cases:
        fmt = "<I" if at == 4 else "<Q"
        with pytest.raises(DataError, match=r"^.*bad-\d+\.gguf: " + message):
            read_gguf(lying(path, tmp_path, at, value, fmt))
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"cut\.gguf: \S+: [\d,]+ bytes at offset [\d,]+ lie past the file's end"):
        read_gguf(str(tmp_path / "cut.gguf"))
    (tmp_path / "text.gguf").write_text("not a model at all, just some words")
    with pytest.raises(DataError, match=r"text\.gguf: starts with b'not ', not b'GGUF'"):
        read_gguf(str(tmp_path / "text.gguf"))


def test_a_tensor_table_that_lies_is_one_line(tiny_gguf, tmp_path):
    """A shape of 2^60 elements, and a type this reader does not dequantize (Q4_K)."""
    gguf_file = read_gguf(str(tiny_gguf[0]))
    data = tiny_gguf[0].read_bytes()
    name = b"output.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # its dimension count, then its dims
    assert struct.unpack_from("<I", data, at)[0] == 2 and gguf_file.tensors["output.weight"].shape == (400, 16)
    with pytest.raises(DataError, match=r"output\.weight: .* bytes at offset .* lie past the file's end"):
        read_gguf(lying(tiny_gguf[0], tmp_path, at + 4 + 8, 1 << 60))
    with pytest.raises(DataError, match=r"output\.weight: tensor type Q4_K; this reader dequantizes F32, F16"):
        read_gguf(lying(tiny_gguf[0], tmp_path, at + 4 + 16, gguf.GGMLQuantizationType.Q4_K.value, "<I"))


def test_the_converted_model_computes_what_the_original_does(tiny_gguf, tmp_path):
    """The folder's Llama (keras-hub's, as amptrain builds it) against the tiny Llama's own
    folder with the same RoPE: the same logits, so the row order came back right."""
    from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

    original = tmp_path / "original"
    shutil.copytree(os.path.join(TINY, "tiny-llama3"), original)
    config = json.load(open(original / "config.json"))
    config.update(rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, max_position_embeddings=32)
    (original / "config.json").write_text(json.dumps(config))
    converted = write_folder(str(tiny_gguf[0]), str(tmp_path / "converted"))
    ids = np.array([[5, 77, 266, 40, 290, 75, 220, 15]], np.int32)
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "positions": np.arange(8, dtype=np.int32)[None]}
    logits = [
        PretrainedLanguageModel(read_checkpoint(str(folder)), 32, 0.0, "float32")(features).numpy()
        for folder in (original, converted)
    ]
    assert np.abs(logits[0] - logits[1]).max() < 1e-5 and np.abs(logits[0]).max() > 1
