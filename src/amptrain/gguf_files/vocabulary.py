"""A GGUF file's tokenizer (its `tokenizer.ggml.*` metadata) as the `tokenizer.json`,
`tokenizer_config.json` and `chat_template.jinja` a `transformers` folder holds.

    specials = write_tokenizer(gguf, "folder")   # {"bos_token_id": 1, "eos_token_id": 2, ...}

A byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the tokens in id order are the vocabulary,
the merges ("a b") in rank order, the control tokens (token type 3) special added tokens, the
user-defined ones (4) plain added tokens. How a text is split before the merges is named by
`tokenizer.ggml.pre` (llama.cpp's pre-tokenizer name); each name here is the split the
model's own `tokenizer.json` makes, and an unknown one is refused rather than guessed.
"""

import json
import os

from amptrain.errors import DataError

CONTROL, USER_DEFINED = 3, 4


def pre_tokenizer(name, path):
    """The `tokenizers` pre-tokenizer of llama.cpp's pre-tokenizer `name`."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if name == "smollm":  # SmolLM and SmolLM2: every digit alone, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in ("gpt-2", "default"):
        return byte_level
    raise DataError(f"{path}: tokenizer.ggml.pre {name!r}; this reader knows smollm, gpt-2 and default")


def write_tokenizer(gguf, folder):
    """Writes the three files into `folder`; returns the special pieces' ids (config.json's)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    meta, path = gguf.metadata, gguf.path
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise DataError(
            f"{path}: tokenizer.ggml.model {meta.get('tokenizer.ggml.model')!r}; this reader converts byte-level "
            "BPE (gpt2)"
        )
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens or [])
    if not tokens or not merges or len(types) != len(tokens) or len(set(tokens)) != len(tokens):
        raise DataError(
            f"{path}: tokenizer.ggml.tokens, merges and token_type: expected distinct tokens, one type each"
        )
    pairs = [tuple(merge.split(" ")) for merge in merges]
    if any(len(pair) != 2 for pair in pairs):
        raise DataError(f"{path}: tokenizer.ggml.merges: expected two pieces a merge, 'a b'")
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"), path)
    tokenizer.decoder = decoders.ByteLevel()
    ids = _special_ids(meta, len(tokens), path)
    start = tokens[ids["bos_token_id"]] if "bos_token_id" in ids else None
    if meta.get("tokenizer.ggml.add_bos_token", False) and start is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{start} $A", pair=f"{start} $A {start} $B", special_tokens=[(start, ids["bos_token_id"])]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    )
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get(f"{meta.get('general.architecture')}.context_length", 2048),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    config.update({name.replace("_id", ""): tokens[i] for name, i in ids.items()})
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
    return ids


def _special_ids(meta, size, path):
    """{"bos_token_id": ..., "eos_token_id": ..., ...} of the ids the metadata names."""
    ids = {}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id")):
        ids[f"{name}_token_id"] = meta.get(f"tokenizer.ggml.{key}")
    ids["pad_token_id"] = meta.get("tokenizer.ggml.padding_token_id")
    for name, value in ids.items():
        if value is not None and not (isinstance(value, int) and 0 <= value < size):
            raise DataError(f"{path}: tokenizer.ggml {name} {value!r:.40}: expected an id below {size}")
    return {name: value for name, value in ids.items() if value is not None}
