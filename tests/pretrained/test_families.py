"""The families beyond BERT (models/families/): each tiny random checkpoint of
tests/pretrained/ (make_families.py made them with `transformers`) tokenized and encoded
as `transformers` does, and the folder checks that refuse a folder before anything is built."""

import json
import os
import shutil
import struct

import numpy as np
import pytest

from amptrain.config.pretrained import read_checkpoint
from amptrain.errors import ConfigError
from amptrain.models.families import family_of

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ["roberta", "xlm-roberta", "distilbert", "albert"]


def folder(family):
    return os.path.join(HERE, f"tiny-{family}")


def reference(family):
    with open(os.path.join(HERE, f"reference-tiny-{family}.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tokenizers():
    """{family: its tokenizer}, built once for the module (RoBERTa's BPE graph traces slowly)."""
    cache = {}

    def get(family):
        if family not in cache:
            checkpoint = read_checkpoint(folder(family))
            cache[family] = family_of(checkpoint).tokenizer(checkpoint)
        return cache[family]

    return get


def checkpoint_ids(tokenizer, ids):
    """amptrain's ids as the checkpoint's (models/families/tokenizers.py swaps 0 and the padding id)."""
    from amptrain.models.families.tokenizers import swapped

    return swapped(np.array(ids), getattr(tokenizer, "pad_id", 0)).tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_and_last_hidden_states_equal_transformers(family, tokenizers):
    """Accents, a URL, an @mention, a hashtag, German, words cut across pieces: the ids with
    the family's start and end pieces; the float32 states of the encoder as a task builds
    it (amptrain's padded ids, the id swap, no segment ids) within 1e-4."""
    import keras
    import tensorflow as tf

    from amptrain.models.pretrained import encode_pretrained

    checkpoint = read_checkpoint(folder(family))
    tokenizer = tokenizers(family)
    token_ids = keras.Input((None,), dtype="int32")
    padding_mask = keras.Input((None,), dtype="bool")
    model_config = type("ModelConfig", (), {"dropout": 0.0})
    states = encode_pretrained(checkpoint, token_ids, padding_mask, model_config, "float32")["sequence_output"]
    encoder = keras.Model([token_ids, padding_mask], states)
    for record in reference(family)["sentences"]:
        ids = [tokenizer.start_id, *tokenizer.encode([record["text"]])[0].tolist(), tokenizer.end_id]
        assert checkpoint_ids(tokenizer, ids) == record["ids"], record["text"]
        padded = tf.constant([ids + [0, 0, 0]])
        computed = encoder([padded, padded != 0]).numpy()[0, : len(ids)]
        assert np.abs(computed - np.array(record["states"])).max() < 1e-4, record["text"]
        assert np.abs(np.array(record["states"])).max() > 0.5  # real states, not a degenerate zero


@pytest.mark.parametrize("family", FAMILIES)
def test_words_tokenize_on_their_own_as_transformers_splits_words(family, tokenizers):
    """NER: each word on its own (RoBERTa after a space, as `add_prefix_space`), and each
    word's first piece where `transformers`' `word_ids()` puts it."""
    tokenizer = tokenizers(family)
    expected = reference(family)
    pieces = tokenizer.encode_words(expected["words"])
    ids = [tokenizer.start_id, *np.concatenate(pieces).tolist(), tokenizer.end_id]
    assert checkpoint_ids(tokenizer, ids) == expected["ids"]
    assert (1 + np.cumsum([0] + [len(p) for p in pieces[:-1]])).tolist() == expected["first_pieces"]


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_equals_the_exports_in_graph_tokenizer(family, tokenizers):
    """`encode` (training, `predict`) and `graph_tokenize` (the export) give the same pieces:
    for RoBERTa two implementations (the `tokenizers` library, keras-hub's graph), on texts
    from all over Unicode, spam mails, and a NUL (read as a space by both)."""
    import csv

    import tensorflow as tf
    from export.test_export_text_ops import random_texts  # tests/: texts from all over the first planes

    tokenizer = tokenizers(family)
    with open(os.path.join(HERE, "..", "..", "data", "classify-spam", "train.csv"), encoding="utf-8") as f:
        mails = [row[0] for row in list(csv.reader(f))[1:41]]
    texts = random_texts(120, seed=3) + mails + ["it's I'll  we've\t\n x", "a\0b", "\0", " lead", "trail "]
    in_graph = tf.function(tokenizer.graph_tokenize, autograph=False)  # as the export traces it
    graph = in_graph(tf.constant(texts)).to_list()
    assert [ids.tolist() for ids in tokenizer.encode(texts)] == graph


def test_the_families_read_their_own_config_keys():
    shapes = {family: read_checkpoint(folder(family)) for family in FAMILIES}
    assert {f: (c.hidden_dim, c.num_layers, c.intermediate_dim) for f, c in shapes.items()} == {
        "roberta": (16, 2, 32),
        "xlm-roberta": (16, 2, 32),
        "distilbert": (16, 2, 32),  # dim, n_layers, hidden_dim
        "albert": (32, 2, 64),
    }
    assert shapes["roberta"].max_positions == 128  # 130 rows, 2 reserved
    assert [shapes[f].lowercase for f in FAMILIES] == [False, False, True, True]


# === A folder refused before anything is built: one line naming what it found ===


def broken(tmp_path, family, config=None, remove=None):
    path = tmp_path / family
    shutil.copytree(folder(family), path)
    if config:
        data = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**data, **config}))
    if remove:
        os.remove(path / remove)
    return str(path)


@pytest.mark.parametrize(
    "family, config, remove, message",
    [
        ("roberta", {"model_type": "bart"}, None, "model_type 'bart' is not supported; supported: bert, roberta"),
        ("roberta", None, "merges.txt", "no merges.txt; expected the tokenizer of a roberta folder"),
        ("xlm-roberta", None, "sentencepiece.bpe.model", "no sentencepiece.bpe.model"),
        ("albert", None, "spiece.model", "no spiece.model"),
        ("distilbert", {"n_layers": "1; import os"}, None, "n_layers: expected an integer from 1 to 128, received '1"),
        ("roberta", {"num_hidden_layers": 100_000}, None, "num_hidden_layers: expected an integer from 1 to 128"),
        ("albert", {"hidden_size": 2.5}, None, "hidden_size: expected an integer from 1 to 16,384, received 2.5"),
        ("roberta", {"hidden_size": 4096}, None, "has shape \\[400, 16\\], but config.json says \\[400, 4096\\]"),
        ("distilbert", {"n_layers": 3}, None, "no weight 'transformer.layer.2.attention.q_lin.weight'"),
        ("roberta", {"num_hidden_layers": 1}, None, "of a layer beyond config.json's 1"),
        ("xlm-roberta", {"auto_map": {"AutoModel": "m.Model"}}, None, "auto_map names code to run"),
    ],
)
def test_a_bad_folder_is_one_line_naming_what_it_found(tmp_path, family, config, remove, message):
    with pytest.raises(ConfigError, match=message) as error:
        read_checkpoint(broken(tmp_path, family, config, remove))
    assert "\n" not in str(error.value)


def rewrite_header(path, edit):
    """The safetensors file at `path` with its JSON header replaced by `edit(header)`."""
    data = open(path, "rb").read()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.dumps(edit(json.loads(data[8 : 8 + length]))).encode()
    open(path, "wb").write(struct.pack("<Q", len(header)) + header + data[8 + length :])


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda h: {
                **h,
                "embeddings.word_embeddings.weight": {"dtype": {"nested": "F32"}, "shape": [1], "data_offsets": [0, 4]},
            },
            "dtype",
        ),
        (lambda h: {**h, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1 << 40]}}, "outside the file"),
        (lambda h: {**h, "x": {"dtype": "F32", "shape": "big", "data_offsets": [0, 4]}}, "expected a list of sizes"),
        (lambda h: [1, 2], "expected a safetensors header of named tensors"),
        # an integer word embedding of the right shape and size trained (values up to 1.2e9)
        (
            lambda h: {
                **h,
                "embeddings.word_embeddings.weight": {**h["embeddings.word_embeddings.weight"], "dtype": "I32"},
            },
            r"'embeddings.word_embeddings.weight': dtype 'I32'; expected a weight in one of F32, F16, BF16",
        ),
        (lambda h: {**h, "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "shape \\[2\\] of F32 needs 8"),
    ],
)
def test_a_smuggled_weights_header_is_refused_before_loading(tmp_path, edit, message):
    path = broken(tmp_path, "roberta")
    rewrite_header(os.path.join(path, "model.safetensors"), edit)
    with pytest.raises(ConfigError, match=message):
        read_checkpoint(path)
