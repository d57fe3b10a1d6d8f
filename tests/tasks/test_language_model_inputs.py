"""What the language model is given, checked (quick): a token file reused only while what it
was made from is unchanged and it is whole, a long line tokenized in spans as it is whole,
and the numbers no model can honour refused in one line."""

import json
import os
import shutil

import numpy as np
import pytest

from amptrain import config as config_lib
from amptrain.bench.memory_plan import parse_memory
from amptrain.config import pretrained
from amptrain.errors import ConfigError, UserError
from amptrain.files import fingerprint
from amptrain.tasks.language_model import corpus, vocabulary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KJV = os.path.join(ROOT, "data", "lm-kjv", "train.txt")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocabulary")
    with open(KJV, encoding="utf-8") as f:
        text = f.read(20_000)
    pieces, merges = vocabulary.learn([text], 300)
    vocabulary.save(pieces, merges, str(folder))
    return vocabulary.load(str(folder))


def test_a_token_file_is_remade_when_its_sources_change_or_it_is_damaged(tokenizer, tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("In the beginning God created\n", encoding="utf-8")
    b.write_text("And the earth was without form\n", encoding="utf-8")
    path, framing = str(tmp_path / "tokens-data.bin"), ([1], [], [1])
    made_from = {"files": fingerprint([str(a)])}
    count = corpus.write_tokens([str(a)], tokenizer, framing, path, made_from)["count"]
    assert len(corpus.cached_tokens(path, made_from)) == count
    assert corpus.cached_tokens(path, {"files": fingerprint([str(b)])}) is None  # another file: not A's tokens
    a.write_text("In the beginning God created the heaven\n", encoding="utf-8")  # same path, newer content
    assert corpus.cached_tokens(path, {"files": fingerprint([str(a)])}) is None
    with open(path, "r+b") as f:  # an odd-sized (truncated) token file
        f.truncate(count * 2 - 1)
    assert corpus.cached_tokens(path, made_from) is None
    corpus.write_tokens([str(a)], tokenizer, framing, path, made_from)
    with open(path, "r+b") as f:  # the same size, other bytes
        f.write(b"\xff\xff")
    assert corpus.cached_tokens(path, made_from) is None


def test_a_long_line_is_tokenized_in_spans_to_the_same_ids_as_whole(tokenizer, monkeypatch):
    with open(KJV, encoding="utf-8") as f:
        line = " ".join(f.read(12_000).split())  # one line, words and punctuation
    whole = tokenizer.encode([line])[0]
    monkeypatch.setattr(corpus, "SPAN_CHARS", 300)
    assert len(list(corpus.spans(line))) > 30
    assert "".join(corpus.spans(line)) == line
    np.testing.assert_array_equal(corpus.encode_documents(tokenizer, [line])[0], whole)


LM_CONFIG = """
task = "language_model"
[data]
train = "{train}"
max_length = 32
"""


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("data.vocabulary_size=100", r"data.vocabulary_size: expected an integer > 258 .*received 100"),
        ("data.vocabulary_size=258", r"data.vocabulary_size: expected an integer > 258 .*received 258"),
        ("generate.temperature=inf", r"generate.temperature: expected a finite number >= 0 .*received inf"),
        ("generate.top_p=nan", r"generate.top_p: expected a number in \(0, 1\], received nan"),
        ("generate.seed=3000000000", r"generate.seed: expected a 32-bit integer, received 3000000000"),
    ],
)
def test_settings_no_language_model_can_honour_are_one_line(tmp_path, setting, message):
    (tmp_path / "lm.toml").write_text(LM_CONFIG.replace("{train}", KJV))
    with pytest.raises(ConfigError, match=message):
        config_lib.load_config(str(tmp_path / "lm.toml"), [setting])


def test_new_tokens_beyond_the_context_are_refused_where_it_generates():
    from amptrain.tasks.language_model.generation import Settings, check

    check(Settings(max_new_tokens=30), context=32, before=1)
    for too_many in (31, 3_000_000_000):
        with pytest.raises(
            ConfigError, match=rf"generate.max_new_tokens: expected an integer from 1 to 30 .*{too_many}"
        ):
            check(Settings(max_new_tokens=too_many), context=32, before=1)


def test_a_pretrained_folder_that_cannot_fit_or_whose_config_is_a_list_is_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "gpt2"
    shutil.copytree(os.path.join(ROOT, "tests", "pretrained", "tiny-gpt2"), folder)
    assert pretrained.read_checkpoint(str(folder)).model_type == "gpt2"
    monkeypatch.setattr(pretrained, "available_memory", lambda: 1000)
    with pytest.raises(ConfigError, match=r"GiB in float32, more than the 0.0 GiB of memory available"):
        pretrained.read_checkpoint(str(folder))
    (folder / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match=r"config.json: a JSON list; expected an object"):
        pretrained.read_checkpoint(str(folder))


@pytest.mark.parametrize("text", ["inf", "0", "-5", "1e30", "nan", "lots"])
def test_a_memory_limit_no_machine_has_is_refused(text):
    with pytest.raises(UserError, match=r"--memory-limit: expected a size above 0 and up to 256TiB"):
        parse_memory(text)
