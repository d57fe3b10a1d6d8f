"""A GGUF file of a Llama-architecture model written as the folder `transformers` saves:
`config.json`, `model.safetensors` (float32, every tensor dequantized, llama.cpp's query and
key row order undone), `tokenizer.json` (the byte-level BPE vocabulary and merges of the
file's metadata), `tokenizer_config.json`, `generation_config.json` and `chat_template.jinja`.

    write_folder("SmolLM2-135M-Instruct.Q4_1.gguf", "pretrained/SmolLM2-135M-Instruct")
    cached_folder("model.gguf")   # the same, once, in the per-user cache keyed by the file's SHA-256

Such a folder is what `model.pretrained` reads (config/pretrained.py); a `.gguf` path there
is converted through `cached_folder`. What `transformers` does with the same file
(`from_pretrained(..., gguf_file=)`) is the reference the tests hold it to.
"""

import json
import os
import shutil
import tempfile

from amptrain.errors import DataError
from amptrain.files import cache_dir, sha256
from amptrain.gguf_files.reader import read_gguf
from amptrain.gguf_files.vocabulary import write_tokenizer

ARCHITECTURES = ("llama",)
# GGUF's tensor names -> transformers' (Llama), `{}` the layer's number.
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
MODEL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
SIZES = {  # config.json's key -> the GGUF key after the architecture's name
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "max_position_embeddings": "context_length",
}


def write_folder(path, dest, replace=True):
    """Converts the GGUF file `path` into the folder `dest` (written beside it, then renamed;
    `replace=False`: a whole folder already there is kept)."""
    gguf = read_gguf(path)
    config = model_config(gguf)
    dest = dest.rstrip("/")
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    partial = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(dest)), prefix=os.path.basename(dest) + ".partial-")
    try:
        _write_weights(gguf, config, os.path.join(partial, "model.safetensors"))
        specials = write_tokenizer(gguf, partial)
        config.update({k: v for k, v in specials.items() if k.endswith("_token_id")})
        _write_json(os.path.join(partial, "config.json"), config)
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
        _write_json(os.path.join(partial, "generation_config.json"), generation)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if os.path.isfile(os.path.join(dest, "config.json")) and replace is False:
        shutil.rmtree(partial, ignore_errors=True)  # another process converted the same file meanwhile
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    os.chmod(partial, 0o755)  # mkdtemp's folder is the owner's alone; the files follow the umask
    os.rename(partial, dest)
    return dest


def cached_folder(path):
    """The folder of the GGUF file `path`, converted once into the per-user cache under the
    file's SHA-256 (never trusted by name or timestamp: another file is another folder)."""
    digest = sha256(path)
    dest = os.path.join(cache_dir(), "gguf", digest[:32])
    if not os.path.isfile(os.path.join(dest, "config.json")):
        write_folder(path, dest, replace=False)
    return dest


def model_config(gguf):
    """config.json of the file's model, as `transformers` writes it for a Llama."""
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise DataError(f"{gguf.path}: general.architecture {arch!r}; this reader converts {', '.join(ARCHITECTURES)}")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu"}
    for key, name in SIZES.items():
        config[key] = _integer(gguf, f"{arch}.{name}")
    heads = config["num_attention_heads"]
    config["num_key_value_heads"] = _integer(gguf, f"{arch}.attention.head_count_kv", heads)
    config["head_dim"] = _integer(gguf, f"{arch}.rope.dimension_count", config["hidden_size"] // heads)
    config["rms_norm_eps"] = float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))
    theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    config["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}  # as transformers 5 writes it
    config["vocab_size"] = gguf.tensors["token_embd.weight"].shape[0] if "token_embd.weight" in gguf.tensors else 0
    config["tie_word_embeddings"] = "output.weight" not in gguf.tensors
    config.update(attention_bias=False, mlp_bias=False, dtype="float32")
    if config["head_dim"] * heads != config["hidden_size"] or heads % config["num_key_value_heads"]:
        raise DataError(
            f"{gguf.path}: {heads} heads of {config['head_dim']} with {config['num_key_value_heads']} key-value "
            f"heads do not make a hidden size of {config['hidden_size']}"
        )
    return config


def _integer(gguf, key, default=None):
    value = gguf.metadata.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DataError(f"{gguf.path}: {key}: expected a positive integer, received {value!r:.40}")
    return value


def transformers_names(gguf, layers):
    """{GGUF tensor name: transformers' name}; a missing or unexpected tensor is one line."""
    names = dict(MODEL_TENSORS)
    if "output.weight" in gguf.tensors:
        names["output.weight"] = "lm_head.weight"
    for i in range(layers):
        names.update({f"blk.{i}.{k}": f"model.layers.{i}.{v}" for k, v in LAYER_TENSORS.items()})
    missing = sorted(set(names) - set(gguf.tensors))
    extra = sorted(set(gguf.tensors) - set(names))  # rope_freqs.weight: a RoPE scaling, not read here
    if missing or extra:
        raise DataError(
            f"{gguf.path}: tensors missing {missing[:4]} or unexpected {extra[:4]} for a Llama of {layers} layers"
        )
    return names


def _write_weights(gguf, config, path):
    """Every tensor dequantized to float32, the query and key rows in `transformers`' order."""
    from safetensors.numpy import save_file

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors = {}
    for name, hf_name in transformers_names(gguf, config["num_hidden_layers"]).items():
        values = gguf.array(name)
        if name.endswith("attn_q.weight"):
            values = unpermute(values, heads)
        elif name.endswith("attn_k.weight"):
            values = unpermute(values, kv_heads)
        tensors[hf_name] = values
    expected = (config["vocab_size"], config["hidden_size"])
    if tensors["model.embed_tokens.weight"].shape != expected:
        raise DataError(f"{gguf.path}: token_embd.weight is {tensors['model.embed_tokens.weight'].shape}")
    save_file(tensors, path, metadata={"format": "pt"})


def unpermute(weights, heads):
    """llama.cpp's converter interleaves each head's rotary halves (its `permute`); this puts
    the rows back in the order `transformers`' rotary embedding expects."""
    rows = weights.shape[0]
    split = weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
    return split.swapaxes(1, 2).reshape(weights.shape)


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")
