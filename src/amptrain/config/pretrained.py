"""A pretrained encoder's folder (`model.pretrained`), read and checked before any slow work.

    checkpoint = read_checkpoint("pretrained/all-MiniLM-L6-v2")
    checkpoint.hidden_dim, checkpoint.lowercase, checkpoint.max_positions   # 384, True, 512
    config = resolve(config, given={"dropout": 0.1})   # model.* shape keys from the checkpoint

Two layouts are read, both offline:
- Hugging Face: `config.json` (with `model_type`), `model.safetensors`, `vocab.txt`, and
  `tokenizer_config.json` for the casing (`do_lower_case`; absent: lower-cased, as
  `transformers`' BertTokenizer defaults).
- keras-hub preset: `config.json` naming `keras_hub>BertBackbone`, `model.weights.h5`,
  `tokenizer.json` and `assets/tokenizer/vocabulary.txt`.

Only JSON and the vocabulary file are read here (no TensorFlow): a folder without weights,
an unsupported `model_type`, a vocabulary that does not match the embedding table or a
`data.max_length` beyond the positions stops the run at once, naming the file.
`models/pretrained.py` builds the encoder from the same folder with keras-hub.
"""

import dataclasses
import hashlib
import json
import os

from amptrain.errors import ConfigError

# The `model_type`s of a Hugging Face folder that keras-hub's converter turns into a
# `BertBackbone` (its token_ids, segment_ids and padding_mask inputs are what the heads
# are built on). keras-hub converts other families into other backbones, with other inputs
# and tokenizers; they are refused until a head is built and tested on one.
SUPPORTED_MODEL_TYPES = ("bert",)
KERAS_HUB_BACKBONES = ("keras_hub>BertBackbone",)
# model.* keys the checkpoint fixes, and its config.json names for them.
SHAPE_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_dim": "hidden_size",
    "num_heads": "num_attention_heads",
    "intermediate_dim": "intermediate_size",
}
POOLING_FILE = os.path.join("1_Pooling", "config.json")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    path: str
    layout: str  # "huggingface" | "keras_hub"
    model_type: str
    num_layers: int
    hidden_dim: int
    num_heads: int
    intermediate_dim: int
    vocabulary_size: int
    max_positions: int
    lowercase: bool
    vocabulary_path: str
    weights_path: str
    # How the classifier pools: "mean" (masked mean of the states) when the checkpoint was
    # trained so (a sentence-transformers `1_Pooling/config.json` saying mean tokens), else
    # "cls" (BERT's pooled [CLS] state, what its pretraining trained).
    pooling: str
    # The feed-forward activation: "gelu" (exact, erf) or "gelu_approximate" (tanh).
    # keras-hub's BertBackbone always builds the tanh form; BERT and MiniLM were trained
    # with the exact one (config.json `hidden_act` "gelu"), which differs by up to 1e-3.
    activation: str = "gelu_approximate"

    def shape(self):
        return {key: getattr(self, key) for key in SHAPE_KEYS}


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None


def read_checkpoint(path):
    """The checkpoint in folder `path`, checked (see the module docstring)."""
    key = "model.pretrained"
    if not os.path.isdir(path):
        raise ConfigError(f"{key}: expected a folder holding a pretrained encoder, received {path!r}")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ConfigError(f"{path}: no config.json; expected a Hugging Face or keras-hub model folder")
    config = _read_json(config_path)
    if "registered_name" in config:
        checkpoint = _keras_hub_checkpoint(path, config_path, config)
    else:
        checkpoint = _huggingface_checkpoint(path, config_path, config)
    if not os.path.isfile(checkpoint.weights_path):
        raise ConfigError(f"{path}: no {os.path.basename(checkpoint.weights_path)}; expected the encoder's weights")
    if not os.path.isfile(checkpoint.vocabulary_path):
        raise ConfigError(f"{path}: no {os.path.relpath(checkpoint.vocabulary_path, path)}; expected its vocabulary")
    pieces = _count_lines(checkpoint.vocabulary_path)
    if pieces != checkpoint.vocabulary_size:
        raise ConfigError(
            f"{checkpoint.vocabulary_path}: {pieces} pieces, but the embedding table of {config_path} has "
            f"{checkpoint.vocabulary_size} rows; expected one piece a row"
        )
    return checkpoint


def _huggingface_checkpoint(path, config_path, config):
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{config_path}: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    missing = [name for name in [*SHAPE_KEYS.values(), "vocab_size", "max_position_embeddings"] if name not in config]
    if missing:
        raise ConfigError(f"{config_path}: no {', '.join(missing)}; expected a BERT config")
    tokenizer_path = os.path.join(path, "tokenizer_config.json")
    tokenizer = _read_json(tokenizer_path) if os.path.isfile(tokenizer_path) else {}
    pooling_path = os.path.join(path, POOLING_FILE)
    pooling = _read_json(pooling_path) if os.path.isfile(pooling_path) else {}
    return Checkpoint(
        path=path,
        layout="huggingface",
        model_type=model_type,
        **{key: int(config[name]) for key, name in SHAPE_KEYS.items()},
        vocabulary_size=int(config["vocab_size"]),
        max_positions=int(config["max_position_embeddings"]),
        lowercase=bool(tokenizer.get("do_lower_case", True)),
        vocabulary_path=os.path.join(path, "vocab.txt"),
        weights_path=os.path.join(path, "model.safetensors"),
        pooling="mean" if pooling.get("pooling_mode_mean_tokens") else "cls",
        activation=_activation(config_path, config.get("hidden_act", "gelu")),
    )


def _activation(config_path, hidden_act):
    """amptrain's name for a Hugging Face `hidden_act` of a BERT."""
    forms = {"gelu": "gelu", "gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate"}
    if hidden_act not in forms:
        raise ConfigError(f"{config_path}: hidden_act {hidden_act!r} is not supported; supported: {', '.join(forms)}")
    return forms[hidden_act]


def _keras_hub_checkpoint(path, config_path, config):
    name = config.get("registered_name")
    if name not in KERAS_HUB_BACKBONES:
        raise ConfigError(f"{config_path}: {name!r} is not supported; supported: {', '.join(KERAS_HUB_BACKBONES)}")
    c = config.get("config", {})
    tokenizer_path = os.path.join(path, "tokenizer.json")
    tokenizer = _read_json(tokenizer_path).get("config", {}) if os.path.isfile(tokenizer_path) else {}
    return Checkpoint(
        path=path,
        layout="keras_hub",
        model_type="bert",
        **{key: int(c[key]) for key in SHAPE_KEYS},
        vocabulary_size=int(c["vocabulary_size"]),
        max_positions=int(c.get("max_sequence_length", 512)),
        lowercase=bool(tokenizer.get("lowercase", True)),
        vocabulary_path=os.path.join(path, "assets", "tokenizer", "vocabulary.txt"),
        weights_path=os.path.join(path, "model.weights.h5"),
        pooling="cls",
    )


def _count_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.rstrip("\r\n"))


def resolve(config, given):
    """`config` with its model shape keys taken from its pretrained checkpoint (unchanged
    without one). `given`: the model keys the config file or overrides set; one that
    conflicts with the checkpoint, a `data.max_length` beyond its positions, or a
    `data.lowercase` against its casing is an error naming both values."""
    path = config.model.pretrained
    if not path:
        return config
    checkpoint = read_checkpoint(path)
    for key, value in checkpoint.shape().items():
        if key in given and given[key] != value:
            raise ConfigError(
                f"model.{key}: {given[key]} conflicts with the checkpoint {path} ({value}); leave it out or set {value}"
            )
    d = config.data
    if d.max_length > checkpoint.max_positions:
        raise ConfigError(
            f"data.max_length: {d.max_length} is beyond the {checkpoint.max_positions} positions of {path}; "
            f"expected at most {checkpoint.max_positions}"
        )
    if d.lowercase is not None and d.lowercase != checkpoint.lowercase:
        raise ConfigError(
            f"data.lowercase: {d.lowercase} conflicts with the checkpoint {path}, which was trained "
            f"{'lower-cased' if checkpoint.lowercase else 'cased'}; leave it out"
        )
    if d.vocabulary:
        raise ConfigError(f"data.vocabulary: {d.vocabulary!r}, but a pretrained encoder brings its own; leave it out")
    model = dataclasses.replace(config.model, **checkpoint.shape())
    return dataclasses.replace(config, model=model)


def weights_hash(checkpoint):
    """The SHA-256 of the checkpoint's weights file (a resume against other weights is refused)."""
    digest = hashlib.sha256()
    with open(checkpoint.weights_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
