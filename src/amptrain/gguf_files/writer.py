"""A Llama-architecture `transformers` folder (SmolLM2, TinyLlama, Llama 2's shape: RoPE unscaled,
a byte-level BPE tokenizer) written as one GGUF file that llama.cpp and Ollama run, with the
`gguf` package's writer, as llama.cpp's own converter (`convert_hf_to_gguf.py`) writes it.

    write_gguf("runs/chat/export-transformers", "model.gguf", quantize="q8_0")

- Metadata: `general.architecture = "llama"`, the sizes, head counts, RMS epsilon and RoPE
  base of config.json; `general.file_type` of the quantization.
- The tokenizer: every piece of tokenizer.json in id order (its added tokens control pieces
  when special, user-defined otherwise; an id nothing names is an unused `[PADn]`), the merges,
  `tokenizer.ggml.pre` named from its pre-tokenizer (`PRE_TOKENIZERS`), the special pieces'
  ids, add-bos/add-eos and the chat template (`gguf.SpecialVocab`, which reads them as
  llama.cpp's converter does).
- The tensors under llama.cpp's names, the query and key rows permuted as its rotary
  embedding expects (`permute`, the inverse of `folder.unpermute`). Vectors (the norms) stay
  float32; matrices are written as `quantize` says: f32, f16, bf16, q8_0 or q4_0 (blocks of
  32 along a row; a matrix whose rows are not whole blocks is written f16, as llama.cpp does).
"""

import json
import os

import numpy as np

from amptrain.errors import UserError
from amptrain.gguf_files.folder import LAYER_TENSORS, MODEL_TENSORS

QUANTIZE = ("f32", "f16", "bf16", "q8_0", "q4_0")
# tokenizer.json's pre-tokenizer -> llama.cpp's name for it (`tokenizer.ggml.pre`)
PRE_TOKENIZERS = {
    "smollm": [{"type": "Digits", "individual_digits": True}, {"type": "ByteLevel", "use_regex": True}],
    "gpt-2": [{"type": "ByteLevel", "use_regex": True}],
}


def write_gguf(folder, path, quantize="f32", name=None):
    """Writes the folder's model into the GGUF file `path`; returns {"tensors", "quantize"}."""
    import gguf

    if quantize not in QUANTIZE:
        raise UserError(f"--quantize {quantize}: expected one of {', '.join(QUANTIZE)}")
    config = check_folder(folder)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name or os.path.basename(os.path.abspath(folder)))
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // heads)
    writer.add_rope_freq_base(float(_rope_theta(config)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(_file_types()[quantize])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocabulary(writer, folder, config["vocab_size"])
    count = 0
    for gguf_name, array in _tensors(folder, config, heads, kv_heads):
        data, kind = _quantized(array, quantize)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"tensors": count, "quantize": quantize}


def _file_types():
    import gguf

    t = gguf.LlamaFileType
    return {"f32": t.ALL_F32, "f16": t.MOSTLY_F16, "bf16": t.MOSTLY_BF16, "q8_0": t.MOSTLY_Q8_0, "q4_0": t.MOSTLY_Q4_0}


def check_folder(folder):
    """The folder's config.json, refused in one line unless it is a Llama this writer writes
    (checked before a run is rebuilt for the export, and again on the folder written)."""
    config = _read_json(folder, "config.json")
    _check_llama(folder, config)
    return config


def _check_llama(folder, config):
    if config.get("model_type") != "llama":
        raise UserError(
            f"{folder}/config.json: model_type {config.get('model_type')!r}; the GGUF export writes the llama "
            "architecture (SmolLM2, Llama 2's shape)"
        )
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UserError(
            f"{folder}/config.json: RoPE scaling {rope.get('rope_type')!r}; the GGUF export writes unscaled RoPE "
            "only (llama.cpp keeps a scaling as a rope_freqs tensor this writer does not make)"
        )
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise UserError(f"{folder}/config.json: biases on the projections; llama.cpp's llama has none")


def _rope_theta(config):
    return config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)


def _add_vocabulary(writer, folder, size):
    import gguf

    tokenizer = _read_json(folder, "tokenizer.json")
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE":
        raise UserError(f"{folder}/tokenizer.json: model {model.get('type')!r}; the GGUF export writes byte-level BPE")
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for piece, i in model["vocab"].items():
        if i < size:
            tokens[i], types[i] = piece, gguf.TokenType.NORMAL
    for added in tokenizer.get("added_tokens") or []:
        if added["id"] < size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_name(folder, tokenizer.get("pre_tokenizer")))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=size).add_to_gguf(writer, quiet=True)


def _pre_name(folder, pre):
    steps = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else [pre or {}]
    for name, expected in PRE_TOKENIZERS.items():
        if len(steps) == len(expected) and all(
            all(step.get(k) == v for k, v in want.items()) for step, want in zip(steps, expected)
        ):
            return name
    raise UserError(
        f"{folder}/tokenizer.json: a pre-tokenizer llama.cpp has no name for here ({json.dumps(pre)[:80]}); "
        f"known: {', '.join(PRE_TOKENIZERS)}"
    )


def _tensors(folder, config, heads, kv_heads):
    """(llama.cpp's name, float32 array) of every weight of the folder's safetensors."""
    from safetensors.numpy import load_file

    weights = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            weights.update(load_file(os.path.join(folder, file)))
    names = {hf: name for name, hf in MODEL_TENSORS.items()}
    names["lm_head.weight"] = "output.weight"
    for i in range(config["num_hidden_layers"]):
        names.update({f"model.layers.{i}.{hf}": f"blk.{i}.{name}" for name, hf in LAYER_TENSORS.items()})
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise UserError(f"{folder}: tensors llama.cpp's llama has no name for: {unknown[:4]}")
    for hf_name in sorted(weights, key=lambda n: (n.startswith("model.layers."), n)):
        array = np.asarray(weights[hf_name], np.float32)
        name = names[hf_name]
        if name.endswith("attn_q.weight"):
            array = permute(array, heads)
        elif name.endswith("attn_k.weight"):
            array = permute(array, kv_heads)
        yield name, array


def permute(weights, heads):
    """The query or key rows in llama.cpp's order: each head's rotary halves interleaved."""
    rows = weights.shape[0]
    return weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _quantized(array, quantize):
    """(data, GGML type): vectors float32; matrices as `quantize` says (f16 where rows are not whole blocks)."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    kind = {"f32": kinds.F32, "f16": kinds.F16, "bf16": kinds.BF16, "q8_0": kinds.Q8_0, "q4_0": kinds.Q4_0}[quantize]
    if array.ndim < 2:
        kind = kinds.F32
    elif kind in (kinds.Q8_0, kinds.Q4_0) and array.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
        kind = kinds.F16
    if kind == kinds.F32:
        return array, kind
    return gguf.quants.quantize(array, kind), kind


def _read_json(folder, name):
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{folder}/{name}: cannot read it ({error})") from None
