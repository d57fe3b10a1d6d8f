"""A pretrained encoder's folder (`model.pretrained`), read and checked before any slow work.

    checkpoint = read_checkpoint("pretrained/all-MiniLM-L6-v2")
    checkpoint.hidden_dim, checkpoint.lowercase, checkpoint.max_positions   # 384, True, 512
    config = resolve(config, given={"dropout": 0.1})   # model.* shape keys from the checkpoint

Two layouts are read, both offline:
- Hugging Face: `config.json` (its `model_type` names the family: models/families/),
  `model.safetensors`, the family's tokenizer files (BERT: `vocab.txt`; RoBERTa:
  `vocab.json` + `merges.txt`; a causal language model: `tokenizer.json`; ...) and
  `tokenizer_config.json` for the casing.
- keras-hub preset (BERT): `config.json` naming `keras_hub>BertBackbone`,
  `model.weights.h5`, `tokenizer.json` and `assets/tokenizer/vocabulary.txt`.

Only JSON, the vocabulary and the weights file's header are read here (no TensorFlow, and
nothing from the folder runs: an `auto_map` is refused): a folder without weights or
tokenizer files, an unknown `model_type`, a size that is no integer or beyond BOUNDS, a
weights header that does not match the config (pretrained_weights.py), a vocabulary that
does not match the embedding table or a `data.max_length` beyond the positions stops the
run at once, in one line naming the file.
`models/pretrained.py` builds the encoder from the same folder with keras-hub.
"""

import dataclasses
import hashlib
import json
import os

from amptrain.config.families import FOLDER_RULES
from amptrain.config.pretrained_weights import check_weights
from amptrain.errors import ConfigError

# The families a Hugging Face folder may be (`config.json`'s `model_type`), each an adapter
# in models/families/; a keras-hub preset folder is read for BERT only.
SUPPORTED_MODEL_TYPES = tuple(FOLDER_RULES)
KERAS_HUB_BACKBONES = ("keras_hub>BertBackbone",)
SHAPE_KEYS = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim")  # model.* keys the checkpoint fixes
POOLING_FILE = os.path.join("1_Pooling", "config.json")
# What a folder may claim before anything is built (the largest released models are well inside).
BOUNDS = {
    "num_layers": 128,
    "hidden_dim": 16384,
    "num_heads": 256,
    "intermediate_dim": 65536,
    "vocabulary_size": 1_000_000,
    "max_positions": 1 << 20,
}


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
    kind: str = "encoder"  # "causal": a decoder-only language model (GPT-2, Llama, Qwen2, Gemma)

    def shape(self):
        return {key: getattr(self, key) for key in SHAPE_KEYS}


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a JSON {type(document).__name__}; expected an object of the model's settings")
    return document


def _check_fits_in_memory(checkpoint):
    """Refuses, before anything is allocated, weights that in float32 (what the model's
    variables hold) exceed the memory available now: a huge but consistent folder was
    otherwise found out only after 61 GiB were allocated."""
    from amptrain.config.pretrained_weights import read_header

    if not checkpoint.weights_path.endswith(".safetensors"):
        return
    count = 0
    for entry in read_header(checkpoint.weights_path).values():
        numel = 1
        for size in entry["shape"]:
            numel *= size
        count += numel
    needed, available = 4 * count, available_memory()
    if available is not None and needed > available:
        raise ConfigError(
            f"{checkpoint.weights_path}: {count:,} weights take {needed / 2**30:.1f} GiB in float32, more than "
            f"the {available / 2**30:.1f} GiB of memory available; expected a model that fits this machine"
        )


def available_memory():
    """Bytes of memory available now (`MemAvailable` of /proc/meminfo), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_checkpoint(path):
    """The checkpoint in folder `path`, checked (see the module docstring). A GGUF file (a
    Llama's, `*.gguf`) is read as the folder it converts to, made once in the per-user cache
    (`gguf_files.folder.cached_folder`): the checkpoint's `path` is then that folder."""
    key = "model.pretrained"
    if os.path.isfile(path) and path.endswith(".gguf"):
        from amptrain.gguf_files.folder import cached_folder

        path = cached_folder(path)
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
    _check_fits_in_memory(checkpoint)
    pieces = _count_pieces(checkpoint.vocabulary_path)
    # A language model's table may have spare rows (Qwen2's), an encoder's has one a piece.
    spare = checkpoint.kind == "causal" and pieces is not None and pieces < checkpoint.vocabulary_size
    if pieces is not None and pieces != checkpoint.vocabulary_size and not spare:
        raise ConfigError(
            f"{checkpoint.vocabulary_path}: {pieces} pieces, but the embedding table of {config_path} has "
            f"{checkpoint.vocabulary_size} rows; expected one piece a row"
        )
    return checkpoint


def _huggingface_checkpoint(path, config_path, config):
    model_type = config.get("model_type")
    if model_type not in FOLDER_RULES:
        raise ConfigError(
            f"{config_path}: model_type {model_type!r:.80} is not supported; supported: {', '.join(FOLDER_RULES)}"
        )
    family = FOLDER_RULES[model_type]
    _refuse_code(config_path, config)
    sizes = _sizes(config_path, config, family)
    unsupported = family.unsupported(config)
    if unsupported:
        raise ConfigError(f"{config_path}: {unsupported}")
    for name in family.tokenizer_files:
        if not os.path.isfile(os.path.join(path, name)):
            raise ConfigError(f"{path}: no {name}; expected the tokenizer of a {model_type} folder")
    tokenizer_path = os.path.join(path, "tokenizer_config.json")
    tokenizer = _read_json(tokenizer_path) if os.path.isfile(tokenizer_path) else {}
    _refuse_code(tokenizer_path, tokenizer)
    pooling_path = os.path.join(path, POOLING_FILE)
    pooling = _read_json(pooling_path) if os.path.isfile(pooling_path) else {}
    weights_path = os.path.join(path, "model.safetensors")
    if os.path.isfile(weights_path):
        shapes = family.weight_shapes({**config, **{family.config_keys[k]: sizes[k] for k in family.config_keys}})
        check_weights(weights_path, shapes, sizes["num_layers"])
    return Checkpoint(
        path=path,
        layout="huggingface",
        model_type=model_type,
        **sizes,
        lowercase=family.lowercase(tokenizer),
        vocabulary_path=os.path.join(path, family.tokenizer_files[0]),
        weights_path=weights_path,
        pooling="mean" if pooling.get("pooling_mode_mean_tokens") else "cls",
        activation=_activation(config_path, config.get(family.activation_key, "gelu")) if family.activation_key else "",
        kind=family.kind,
    )


def _refuse_code(path, config):
    """A folder may name code to run (`auto_map`, `transformers`' trust_remote_code); none runs here."""
    if isinstance(config, dict) and "auto_map" in config:
        raise ConfigError(f"{path}: auto_map names code to run; amptrain runs none from a folder (remove auto_map)")


def _sizes(config_path, config, family):
    """The checkpoint's SHAPE_KEYS and SIZE_KEYS from `config`, each an integer within BOUNDS."""
    sizes = {}
    for key, name in family.config_keys.items():
        if name not in config:
            raise ConfigError(f"{config_path}: no {name}; expected a {family.model_type} config")
        value = config[name]
        if type(value) is not int or not 1 <= value <= BOUNDS[key]:
            raise ConfigError(
                f"{config_path}: {name}: expected an integer from 1 to {BOUNDS[key]:,}, received {value!r:.60}"
            )
        sizes[key] = value
    sizes["max_positions"] -= family.position_offset
    if "intermediate_dim" not in family.config_keys:  # GPT-2: 4 x n_embd, as keras-hub builds it
        sizes["intermediate_dim"] = 4 * sizes["hidden_dim"]
        inner = config.get("n_inner")
        if inner is not None and inner != sizes["intermediate_dim"]:
            expected = f"null or {sizes['intermediate_dim']} (4 x n_embd)"
            raise ConfigError(f"{config_path}: n_inner: expected {expected}, received {inner!r:.60}")
    if sizes["hidden_dim"] % sizes["num_heads"]:
        raise ConfigError(
            f"{config_path}: {family.config_keys['hidden_dim']} {sizes['hidden_dim']} is not divisible by "
            f"{family.config_keys['num_heads']} {sizes['num_heads']}"
        )
    return sizes


def _activation(config_path, hidden_act):
    """amptrain's name for a Hugging Face `hidden_act` of a BERT."""
    forms = {"gelu": "gelu", "gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate"}
    if not isinstance(hidden_act, str) or hidden_act not in forms:
        raise ConfigError(
            f"{config_path}: hidden_act {hidden_act!r:.60} is not supported; supported: {', '.join(forms)}"
        )
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


def _count_pieces(path):
    """The pieces of a vocabulary file (vocab.txt: a line each; vocab.json: an entry each;
    tokenizer.json: its model's pieces and the tokens added to them); None for a SentencePiece
    model, counted when its tokenizer is built."""
    if os.path.basename(path) == "tokenizer.json":
        tokenizer = _read_json(path)
        model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
        vocabulary = model.get("vocab") if isinstance(model, dict) else None
        if not isinstance(vocabulary, dict):
            raise ConfigError(f"{path}: no model.vocab; expected the tokenizer.json of a byte-pair tokenizer")
        added = tokenizer.get("added_tokens") or []
        return len(set(vocabulary.values()) | {t.get("id") for t in added if isinstance(t, dict)})
    if path.endswith(".json"):
        return len(_read_json(path))
    if not path.endswith(".txt"):
        return None
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
