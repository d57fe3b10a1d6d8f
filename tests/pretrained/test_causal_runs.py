"""A pretrained causal language model fine-tuned with LoRA end to end (slow: several fits):
dev bits per byte fall from the folder's own, the checkpoints hold the adapters alone and
resume to the uninterrupted run's, the export (adapters merged) generates what predict
does, and the graph tokenizer of every family gives tokenizer.json's ids."""

import os
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from pretrained.test_causal import FAMILIES, folder, reference

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.errors import Interrupted

pytestmark = pytest.mark.slow
KJV = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "lm-kjv")
LORA_CONFIG = """
task = "language_model"
[data]
train = "{dir}/train.txt"
dev = "{dir}/dev.txt"
test = "{dir}/dev.txt"
max_length = 64
[model]
pretrained = "{pretrained}"
dropout = 0.0
[precision]
policy = "float32"
[runtime]
jit_compile = false
deterministic = true
[train]
steps = 30
batch_size = 8
learning_rate = 1e-2
warmup_steps = 0
decay = "constant"
log_every = 10
eval_every = 10
checkpoint_every = 10
lora_rank = 4
lora_targets = "query,value,down"
[generate]
max_new_tokens = 8
"""
PROMPTS = ["And God said", "In the beginning 1234  x", "", "Café 🙂"]


@pytest.fixture(scope="module")
def lora_folder(tmp_path_factory):
    """The shipped corpus's first 40,000 characters (6,000 of dev) and a LoRA config on tiny-llama3."""
    path = tmp_path_factory.mktemp("lora")
    for name, size in (("train.txt", 40_000), ("dev.txt", 6_000)):
        with open(os.path.join(KJV, name), encoding="utf-8") as f:
            (path / name).write_text(f.read(size), encoding="utf-8")
    (path / "lora.toml").write_text(LORA_CONFIG.format(dir=path, pretrained=folder("llama3")))
    return path


@pytest.fixture(scope="module")
def lora_run(lora_folder):
    amptrain.fit(str(lora_folder / "lora.toml"), run_dir=str(lora_folder / "run"))
    return lora_folder / "run"


def test_lora_lowers_dev_bits_per_byte_from_the_folders_own(lora_folder, lora_run):
    task, model, predict, _ = amptrain.api.load_run(folder("llama3"), (), overrides=[("data.max_length", 64)])
    task.add_split("dev", str(lora_folder / "dev.txt"))
    before = task.evaluate("dev", model, predict)["bits_per_byte"]
    evals = [r for r in read_metrics(lora_run / "metrics.jsonl") if r["kind"] == "eval" and r["split"] == "dev"]
    assert evals[-1]["bits_per_byte"] < before - 0.1
    run = next(r for r in read_metrics(lora_run / "metrics.jsonl") if r["kind"] == "run")
    memory = run["memory"]  # 2 layers x (query A 16x2x4 + B 4x8, value 16x1x4 + 4x8, down 32x4 + 4x16)
    assert memory["trainable_parameters"] == 2 * (128 + 32 + 64 + 32 + 128 + 64) == 896
    assert memory["optimizer_slots_bytes"] == 2 * 4 * 896 + 8  # Adam's two moments and its step count


def test_checkpoints_hold_the_adapters_and_resume_to_the_uninterrupted_run(lora_folder, lora_run):
    reader = tf.train.load_checkpoint(str(lora_run / "checkpoints" / "ckpt-30"))
    names = reader.get_variable_to_shape_map()
    assert not [n for n in names if n.startswith("model/") and "adapters" not in n and "base_weights" not in n]
    assert reader.get_tensor("model/base_weights/.ATTRIBUTES/VARIABLE_VALUE").decode() != ""
    resumed = lora_folder / "resumed"
    config = str(lora_folder / "lora.toml")
    stop = threading.Thread(target=terminate_at, args=(resumed / "checkpoints" / "ckpt-10.index",), daemon=True)
    stop.start()
    with pytest.raises(Interrupted):  # SIGTERM: a checkpoint at the step it lands, then out
        amptrain.fit(config, run_dir=str(resumed))
    stop.join()
    assert not (resumed / "checkpoints" / "ckpt-30.index").exists()
    amptrain.fit(config, run_dir=str(resumed))
    runs = [r for r in read_metrics(resumed / "metrics.jsonl") if r["kind"] == "run"]
    assert runs[-1]["resumed_from_step"] >= 10
    other = tf.train.load_checkpoint(str(resumed / "checkpoints" / "ckpt-30"))
    for name in names:
        if "adapters" in name:
            assert np.array_equal(reader.get_tensor(name), other.get_tensor(name)), name


def terminate_at(path, timeout=120):
    """SIGTERM to this process once `path` exists (the fit in the main thread saves and stops)."""
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)


def test_the_export_merges_the_adapters_and_generates_what_predict_does(lora_run):
    amptrain.export(str(lora_run))
    records = amptrain.predict(str(lora_run), PROMPTS)
    assert [r["generated"] for r in amptrain.predict(str(lora_run / "export"), PROMPTS)] == [
        r["generated"] for r in records
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_graph_tokenizer_gives_tokenizer_json_ids(family):
    """Digit runs, whitespace runs, special pieces in the text, Unicode spaces, accents, an
    emoji, contractions; and 200 lines of the shipped dev text."""
    from amptrain.config.pretrained import read_checkpoint
    from amptrain.tasks.language_model.families import family_of

    checkpoint = read_checkpoint(folder(family))
    tokenizer = family_of(checkpoint).tokenizer(checkpoint)
    with open(os.path.join(KJV, "dev.txt"), encoding="utf-8") as f:
        lines = f.read(20_000).split("\n")[:200]
    texts = [
        "Price: 12345 and 7", "I'M (hello) end  ", "a  b\n\n  c\t\td", "x <|endoftext|> y<|im_start|>!",
        "no\u00a0break\u3000wide  \u2003em", "", "   ", "line\r\nbreak", "don't WON'T it's", "!!! ... -- 3.14159",
        *[r["text"] for r in reference(family)], *lines,
    ]  # fmt: skip
    graph = tokenizer.graph_form()
    got = tf.function(graph.graph_tokenize)(tf.constant(texts))
    want = tokenizer.encode(texts)
    assert [row.tolist() for row in got.numpy()] == [ids.tolist() for ids in want]
    back = tf.function(graph.graph_detokenize)(tf.ragged.constant([ids.tolist() for ids in want[:10]], tf.int32))
    assert [b.decode("utf-8") for b in back.numpy()] == [tokenizer.decode(ids) for ids in want[:10]]
