"""The language-model task on tiny models (quick): the corpus and its documents, the
vocabulary learned the same way twice, packing that changes no document's losses, bits per
byte over every piece once, the cached generation against recomputing the prefix, sampling
under a seed, and a tiny fit whose records say real tokens = padded."""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_only_amptrains

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.errors import DataError
from amptrain.tasks.language_model import corpus, generation, vocabulary
from amptrain.tasks.language_model.blocks import BlockPlan, scores, segments_and_positions
from amptrain.tasks.language_model.cross_entropy import summed_cross_entropy, token_cross_entropy
from amptrain.tasks.language_model.generation import Settings, continuation, generate, greedy_by_recomputing
from amptrain.tasks.language_model.model import LanguageModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KJV = os.path.join(ROOT, "data", "lm-kjv")
SIZES = {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 32, "dropout": 0.0}

TINY_LM_CONFIG = """
task = "language_model"
[data]
train = "{dir}/train.txt"
dev = "{dir}/dev.txt"
test = "{dir}/dev.txt"
vocabulary_size = 300
max_length = 32
[model]
num_layers = 1
hidden_dim = 16
num_heads = 2
intermediate_dim = 32
dropout = 0.0
[precision]
policy = "float32"
[runtime]
jit_compile = false
[train]
steps = 8
batch_size = 8
learning_rate = 3e-3
warmup_steps = 0
decay = "constant"
log_every = 4
eval_every = 8
checkpoint_every = 4
[generate]
max_new_tokens = 8
"""


def write_tiny_corpus(folder):
    """The first 40,000 characters of the KJV training text, 6,000 of dev, and `tiny.toml`
    (TINY_LM_CONFIG) in `folder`; returns it."""
    for name, size in (("train.txt", 40_000), ("dev.txt", 6_000)):
        with open(os.path.join(KJV, name), encoding="utf-8") as f:
            (folder / name).write_text(f.read(size), encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_LM_CONFIG.replace("{dir}", str(folder)))
    return folder


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("lm"))


def test_documents_end_at_a_blank_line_or_a_files_end_and_a_folder_or_glob_names_files(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n\n\nthree\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("four", encoding="utf-8")
    files = corpus.corpus_files(str(tmp_path))
    assert files == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")] == corpus.corpus_files(str(tmp_path / "*.txt"))
    assert list(corpus.documents(files)) == ["one\ntwo", "three", "four"]
    assert corpus.corpus_bytes(files) == 16 + 4
    with pytest.raises(DataError, match="no text file; expected a file, a folder of files or a glob"):
        corpus.corpus_files(str(tmp_path / "*.md"))


def test_the_same_text_gives_the_same_vocabulary_and_it_tokenizes_every_byte(tmp_path):
    with open(os.path.join(KJV, "dev.txt"), encoding="utf-8") as f:
        texts = f.read(30_000).split("\n\n")
    first, second = vocabulary.learn(texts, 400), vocabulary.learn(list(texts), 400)
    assert first == second and len(first[0]) == 400 and first[0][:2] == [vocabulary.PAD, vocabulary.EOD]
    vocabulary.save(*first, tmp_path)
    tokenizer = vocabulary.load(tmp_path)
    text = "And God said, Let there be light: ünïcödé 😀 \x00 tabs\tand\nlines"
    (ids,) = tokenizer.encode([text])
    assert tokenizer.decode(ids) == text.replace("\x00", " ") and 0 not in ids and tokenizer.end_id == 1


def tiny_model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    model = LanguageModel(50, 16, SIZES, "float32")
    model.build()
    return model


def features(ids, eod):
    ids = np.array([ids], np.int32)
    segments, positions = segments_and_positions(ids == eod, np.ones_like(ids, bool))
    return {"token_ids": ids, "segment_ids": segments, "positions": positions}


def test_a_documents_losses_are_the_same_packed_or_alone():
    """Block "EOD a b c EOD d e f g": the second document's next-piece losses equal its own
    alone, to float32 rounding: attention and positions stop at its start."""
    model, eod = tiny_model(), 1
    first, second = [eod, 7, 8, 9], [eod, 20, 21, 22, 23]
    packed = model(features(first + second, eod))[0].numpy()
    alone = model(features(second, eod))[0].numpy()
    log_packed = packed - np.log(np.exp(packed).sum(-1, keepdims=True))
    log_alone = alone - np.log(np.exp(alone).sum(-1, keepdims=True))
    targets = second[1:]
    got = [log_packed[len(first) + i, t] for i, t in enumerate(targets)]
    want = [log_alone[i, t] for i, t in enumerate(targets)]
    assert np.max(np.abs(np.array(got) - np.array(want))) < 1e-5


def test_segments_and_positions_restart_at_each_document():
    ids = np.array([[5, 6, 1, 7, 8, 1, 9, 0]])
    real = np.array([[True] * 7 + [False]])
    segments, positions = segments_and_positions(ids == 1, real)
    assert segments.tolist() == [[0, 0, 1, 1, 1, 2, 2, -1]] and positions.tolist() == [[0, 1, 0, 1, 2, 0, 1, 0]]


def test_greedy_generation_from_the_cache_equals_recomputing_the_prefix():
    model, eod = tiny_model(seed=3), 1
    prompts = [[eod, 4, 9, 12], [eod, 30]]
    lengths = np.array([4, 2], np.int32)
    padded = np.array([p + [0] * (4 - len(p)) for p in prompts], np.int32)
    out = generate(model, padded, lengths, eod, Settings(max_new_tokens=9)).numpy()
    for row, prompt in enumerate(prompts):
        expected = greedy_by_recomputing(model, prompt, eod, 9)
        assert continuation(out[row], len(prompt), eod).tolist() == expected[expected != eod].tolist()[: len(expected)]


def test_sampling_under_a_seed_repeats_and_the_filters_hold():
    model, eod = tiny_model(seed=4), 1
    prompt, lengths = np.array([[eod, 5]], np.int32), np.array([2], np.int32)
    settings = Settings(max_new_tokens=12, temperature=1.5, top_k=5, top_p=0.9, seed=7)
    first = generate(model, prompt, lengths, eod, settings).numpy()
    assert (generate(model, prompt, lengths, eod, settings).numpy() == first).all()
    other = generate(model, prompt, lengths, eod, Settings(max_new_tokens=12, temperature=1.5, seed=8)).numpy()
    assert not (other == first).all()
    # top_k = 1 samples the argmax: greedy whatever the temperature and seed
    greedy = generate(model, prompt, lengths, eod, Settings(max_new_tokens=12)).numpy()
    one = generate(model, prompt, lengths, eod, Settings(max_new_tokens=12, temperature=2.0, top_k=1, seed=9))
    assert (one.numpy() == greedy).all()


def test_a_sampled_continuation_depends_on_its_prompt_and_seed_only_not_on_the_batch():
    model, eod = tiny_model(seed=5), 1
    settings = Settings(max_new_tokens=10, temperature=1.0, seed=3)
    traced = generation._generate.experimental_get_tracing_count()
    alone = generate(model, np.array([[eod, 7, 8]], np.int32), np.array([3], np.int32), eod, settings).numpy()
    batch = np.array([[eod, 30, -1], [eod, 7, 8], [eod, 7, 8]], np.int32)  # second and third: the same prompt
    together = generate(model, batch, np.array([2, 3, 3], np.int32), eod, settings).numpy()
    assert together[1].tolist() == together[2].tolist() == alone[0].tolist()
    reseeded = generate(model, batch[1:2], np.array([3], np.int32), eod, Settings(10, 1.0, seed=4)).numpy()
    assert reseeded[0].tolist() != alone[0].tolist()
    # traced once for every batch and prompt length (each trace keeps its graph)
    assert generation._generate.experimental_get_tracing_count() == traced + 1


def test_bits_per_byte_are_nats_over_bytes_and_every_piece_is_scored_once():
    # states · tableᵀ = log([0.5, 0.25, 0.25]) and log([0.25, 0.5, 0.25]); the third row unscored
    states = tf.constant(np.log([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.2, 0.3, 0.5]]), tf.float32)
    losses = token_cross_entropy(states, tf.eye(3), tf.constant([0, 2, -1])).numpy()
    nats = float(losses.sum())
    assert losses[2] == 0 and nats == pytest.approx(math.log(2) + math.log(4))  # 1 bit + 2 bits
    assert scores(nats, 2, 3)["bits_per_byte"] == pytest.approx(1.0)  # 3 bits over 3 bytes
    plan = BlockPlan(num_blocks=5, rows=2, length=8, seed=0, shuffle=False)
    assert [plan.batch(s)[0].tolist() for s in range(plan.steps_per_epoch)] == [[0, 1], [2, 3], [4, -1]]


def test_the_chunked_cross_entropy_and_its_gradients_equal_the_whole_logits(monkeypatch):
    """Chunks of 3 rows over 10 rows (the last one short), against log-softmax of all logits."""
    from amptrain.tasks.language_model import cross_entropy

    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", 3 * 7)
    rng = np.random.default_rng(0)
    states = tf.constant(rng.normal(size=(10, 5)), tf.float32)
    table = tf.constant(rng.normal(size=(7, 5)), tf.float32)
    labels = tf.constant([3, 0, 6, -1, 2, 2, 5, -1, 1, 4])
    scored = tf.cast(labels >= 0, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([states, table])
        chunked = summed_cross_entropy(states, table, labels)
        log_p = tf.nn.log_softmax(tf.matmul(states, table, transpose_b=True))
        whole = -tf.reduce_sum(tf.gather(log_p, tf.maximum(labels, 0), batch_dims=1) * scored)
        frozen = summed_cross_entropy(states, table, labels, table_gradient=False)
        scaled = [chunked * 3.0, whole * 3.0, frozen * 3.0]  # an upstream gradient other than 1
    assert abs(float(chunked) - float(whole)) < 1e-5 and float(frozen) == float(chunked)
    for got, want in zip(tape.gradient(scaled[0], [states, table]), tape.gradient(scaled[1], [states, table])):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    d_states, d_table = tape.gradient(scaled[2], [states, table])  # a frozen table: the states' alone
    assert d_table is None
    np.testing.assert_allclose(d_states.numpy(), tape.gradient(scaled[1], states).numpy(), atol=1e-5)
    # products in bfloat16 (a mixed_bfloat16 network's head): the sums in float32, so within
    # bfloat16's rounding of the inputs and logits (8 bits: about 0.4%)
    with tf.GradientTape() as half_tape:
        half_tape.watch([states, table])
        half = summed_cross_entropy(states, table, labels, products="bfloat16")
    assert abs(float(half) - float(whole)) < 0.01 * abs(float(whole))
    for got, want in zip(half_tape.gradient(half, [states, table]), tape.gradient(scaled[1], [states, table])):
        np.testing.assert_allclose(got.numpy(), want.numpy() / 3.0, atol=0.05)
    every = token_cross_entropy(states, table, labels).numpy()
    assert abs(every.sum() - float(whole)) < 1e-5 and every[3] == every[7] == 0


def test_a_tiny_fit_scores_every_piece_continues_prompts_and_packs_without_padding(tiny_lm, tmp_path):
    run = tmp_path / "run"
    amptrain.fit(str(tiny_lm / "tiny.toml"), run_dir=str(run))
    records = read_metrics(str(run / "metrics.jsonl"))
    train = [r for r in records if r["kind"] == "train"]
    assert train and all(r["real_over_padded"] == 1.0 and r["tokens_per_step"] == 8 * 32 for r in train)
    test = [r for r in records if r["kind"] == "eval" and r["split"] == "test"][-1]
    tokens = np.memmap(run / "tokens-test.bin", dtype=np.uint16, mode="r")
    assert test["tokens"] == len(tokens) - 1 and test["bytes"] == os.path.getsize(tiny_lm / "dev.txt")
    assert test["bits_per_byte"] == pytest.approx(test["loss"] * test["tokens"] / math.log(2) / test["bytes"])
    (record,) = amptrain.predict(str(run), ["And God said"])
    assert record["text"] == "And God said" and isinstance(record["generated"], str)
    assert json.loads((run / "vocab.json").read_text(encoding="utf-8"))["<|endoftext|>"] == 1
    assert_only_amptrains(run)
