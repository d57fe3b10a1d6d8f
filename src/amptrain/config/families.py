"""What a pretrained family's folder must hold (`model.pretrained`), read from JSON alone:
its config.json keys, its tokenizer files, its casing and the weights its config implies.

    rules = FOLDER_RULES["distilbert"]
    rules.config_keys["hidden_dim"], rules.tokenizer_files   # "dim", ("vocab.txt",)
    FOLDER_RULES["llama"].kind                               # "causal": a language model's

Encoders (BERT, RoBERTa, XLM-R, DistilBERT, ALBERT) serve classification and NER; causal
language models (GPT-2, Llama 3, Qwen2, Gemma), whose tokenizer is one `tokenizer.json`,
the language-model task.

The model side of each family (keras-hub backbone, tokenizer, layer walk, pooling,
corrections) is its adapter in models/families/, one file a family; this table is the part
`config/pretrained.py` checks a folder against before anything is built (the config layer
imports no model code). A new family is one entry here and one file there.
"""

import dataclasses
from collections.abc import Callable

BERT_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_dim": "hidden_size",
    "num_heads": "num_attention_heads",
    "intermediate_dim": "intermediate_size",
    "vocabulary_size": "vocab_size",
    "max_positions": "max_position_embeddings",
}
DISTILBERT_KEYS = {
    "num_layers": "n_layers",
    "hidden_dim": "dim",
    "num_heads": "n_heads",
    "intermediate_dim": "hidden_dim",  # DistilBERT's name for the feed-forward width
    "vocabulary_size": "vocab_size",
    "max_positions": "max_position_embeddings",
}


@dataclasses.dataclass(frozen=True)
class FolderRules:
    model_type: str  # config.json's `model_type`
    config_keys: dict  # amptrain's names (model.* and the sizes) -> config.json's
    tokenizer_files: tuple  # the first is `Checkpoint.vocabulary_path`
    lowercase: Callable  # (tokenizer_config.json's dict) -> whether the tokenizer lower-cases
    weight_shapes: Callable  # (config.json's dict) -> {weight name: shape} the weights must hold
    activation_key: str = "hidden_act"  # "": the family's activation is its own (keras-hub builds it)
    position_offset: int = 0  # position rows the family reserves (RoBERTa's padding_idx + 1)
    kind: str = "encoder"  # "encoder" (classification, ner) or "causal" (language_model)
    # (config.json's dict) -> what keras-hub would build otherwise than `transformers` ("key: expected …,
    # received …"), or "": such a folder is refused rather than run differently
    unsupported: Callable = lambda config: ""


def lower_cased(tokenizer_config):
    """`do_lower_case` (absent: lower-cased, as `transformers`' BERT and ALBERT tokenizers default)."""
    return bool(tokenizer_config.get("do_lower_case", True))


def cased(tokenizer_config):
    return False


def bert_weights(config):
    """The word embeddings and each layer's first and last weights, BERT's names."""
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    shapes = {"embeddings.word_embeddings.weight": (config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        shapes[f"encoder.layer.{i}.attention.self.query.weight"] = (hidden, hidden)
        shapes[f"encoder.layer.{i}.output.dense.weight"] = (hidden, intermediate)
    return shapes


def roberta_weights(config):
    rows = config.get("type_vocab_size", 1)
    return {**bert_weights(config), "embeddings.token_type_embeddings.weight": (rows, config["hidden_size"])}


def distilbert_weights(config):
    dim, intermediate = config["dim"], config["hidden_dim"]
    shapes = {"embeddings.word_embeddings.weight": (config["vocab_size"], dim)}
    for i in range(config["n_layers"]):
        shapes[f"transformer.layer.{i}.attention.q_lin.weight"] = (dim, dim)
        shapes[f"transformer.layer.{i}.ffn.lin2.weight"] = (dim, intermediate)
    return shapes


def albert_weights(config):
    """ALBERT's factorised embeddings and its shared layers (`num_hidden_groups` x `inner_group_num`)."""
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    shapes = {"embeddings.word_embeddings.weight": (config["vocab_size"], config.get("embedding_size", 128))}
    for g in range(_count(config, "num_hidden_groups")):
        for i in range(_count(config, "inner_group_num")):
            prefix = f"encoder.albert_layer_groups.{g}.albert_layers.{i}."
            shapes[prefix + "attention.query.weight"] = (hidden, hidden)
            shapes[prefix + "ffn_output.weight"] = (hidden, intermediate)
    return shapes


def _count(config, key):
    value = config.get(key, 1)
    return value if type(value) is int and 1 <= value <= 128 else 0  # a bad count: no weight matches


GPT2_KEYS = {
    "num_layers": "n_layer",
    "hidden_dim": "n_embd",
    "num_heads": "n_head",
    "vocabulary_size": "vocab_size",
    "max_positions": "n_positions",
}  # the feed-forward is 4 x n_embd wide (keras-hub's GPT-2 builds it so; `n_inner` must agree)
DECODER_KEYS = {**BERT_KEYS}  # Llama, Qwen2, Gemma name their sizes as BERT does


def gpt2_weights(config):
    """GPT-2's token table and each layer's fused query-key-value (Conv1D: in x out)."""
    hidden = config["n_embd"]
    shapes = {"wte.weight": (config["vocab_size"], hidden)}
    for i in range(config["n_layer"]):
        shapes[f"h.{i}.attn.c_attn.weight"] = (hidden, 3 * hidden)
        shapes[f"h.{i}.mlp.c_proj.weight"] = (4 * hidden, hidden)
    return shapes


def decoder_weights(config):
    """The token table and each layer's query and down projections (Llama's names, which
    Qwen2 and Gemma share); a head is `head_dim` wide where the config says so."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {"embed_tokens.weight": (config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        shapes[f"layers.{i}.self_attn.q_proj.weight"] = (heads * head_dim, hidden)
        shapes[f"layers.{i}.mlp.down_proj.weight"] = (hidden, config["intermediate_size"])
    return shapes


def differing(config, expected):
    """The first of `expected` ({key: (value if absent, the values keras-hub builds)}) that
    config.json sets otherwise, as "key: expected …, received …"; "" when none."""
    for key, (default, accepted) in expected.items():
        value = config.get(key, default)
        if key == "rope_theta" and "rope_parameters" in config:  # where transformers 5 writes it
            value = (config.get("rope_parameters") or {}).get("rope_theta", default)
        if value not in accepted:
            return f"{key}: expected {' or '.join(map(repr, accepted))} (what keras-hub builds), received {value!r:.60}"
    return ""


def gpt2_unsupported(config):
    return differing(
        config,
        {
            "layer_norm_epsilon": (1e-5, (1e-5,)),
            "activation_function": ("gelu_new", ("gelu_new", "gelu_pytorch_tanh")),
            "scale_attn_by_inverse_layer_idx": (False, (False,)),
            "reorder_and_upcast_attn": (False, (False,)),
        },
    )


def llama_unsupported(config):
    return differing(
        config, {"attention_bias": (False, (False,)), "mlp_bias": (False, (False,)), "hidden_act": ("silu", ("silu",))}
    )


def qwen2_unsupported(config):
    return differing(config, {"use_sliding_window": (False, (False,)), "hidden_act": ("silu", ("silu",))})


def gemma_unsupported(config):
    activation = config.get("hidden_activation") or "gelu_pytorch_tanh"  # transformers' own default
    return differing(
        {**config, "hidden_activation": activation},
        {
            "rms_norm_eps": (1e-6, (1e-6,)),
            "rope_theta": (10000.0, (10000, 10000.0)),
            "hidden_activation": ("", ("gelu_pytorch_tanh", "gelu_new")),
        },
    )


def causal(model_type, keys, weights, unsupported):
    return FolderRules(
        model_type, keys, ("tokenizer.json",), cased, weights, activation_key="", kind="causal", unsupported=unsupported
    )


FOLDER_RULES = {
    rules.model_type: rules
    for rules in (
        FolderRules("bert", BERT_KEYS, ("vocab.txt",), lower_cased, bert_weights),
        FolderRules("roberta", BERT_KEYS, ("vocab.json", "merges.txt"), cased, roberta_weights, position_offset=2),
        FolderRules("xlm-roberta", BERT_KEYS, ("sentencepiece.bpe.model",), cased, roberta_weights, position_offset=2),
        FolderRules("distilbert", DISTILBERT_KEYS, ("vocab.txt",), lower_cased, distilbert_weights, "activation"),
        FolderRules("albert", BERT_KEYS, ("spiece.model",), lower_cased, albert_weights),
        causal("gpt2", GPT2_KEYS, gpt2_weights, gpt2_unsupported),
        causal("llama", DECODER_KEYS, decoder_weights, llama_unsupported),
        causal("qwen2", DECODER_KEYS, decoder_weights, qwen2_unsupported),
        causal("gemma", DECODER_KEYS, decoder_weights, gemma_unsupported),
    )
}
