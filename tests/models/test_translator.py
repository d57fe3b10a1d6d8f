"""The encoder-decoder: causal masking, the cached decoder against the full pass, and
beam search against greedy search on a toy model whose best output is known."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from amptrain.tasks.translation.decoding import Search
from amptrain.tasks.translation.model import Translator

CONFIG = SimpleNamespace(
    num_layers=2,
    num_decoder_layers=2,
    hidden_dim=16,
    num_heads=2,
    intermediate_dim=32,
    dropout=0.0,
    tie_embeddings=True,
)


@pytest.fixture(scope="module")
def model():
    keras_seed = 3
    tf.keras.utils.set_random_seed(keras_seed)
    return Translator(50, 50, 16, CONFIG, "float32", shared_embedding=True).build_all()


def features(source, target):
    source, target = np.array(source, np.int32), np.array(target, np.int32)
    return {"source_ids": source, "source_mask": source != 0, "target_ids": target, "target_mask": target != 0}


def test_a_later_target_piece_cannot_change_an_earlier_position(model):
    source = [[5, 6, 7, 8, 0]]
    a = model(features(source, [[1, 10, 11, 12, 13]])).numpy()
    b = model(features(source, [[1, 10, 11, 40, 41]])).numpy()
    assert np.array_equal(a[:, :3], b[:, :3])  # positions 0..2 see pieces 0..2 only
    assert not np.allclose(a[:, 3], b[:, 3])


def test_source_padding_is_not_attended(model):
    target = [[1, 10, 11]]
    a = model(features([[5, 6, 7, 0, 0]], target)).numpy()
    b = features([[5, 6, 7, 30, 31]], target)
    b["source_mask"] = np.array([[True, True, True, False, False]])
    assert np.allclose(a, model(b).numpy(), atol=1e-6)


def test_a_checkpoint_holds_every_weight(model, tmp_path):
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path) if name.startswith("model/")}
    assert len(saved) == len(model.weights)  # every block's weights too, not just the embeddings
    fresh = Translator(50, 50, 16, CONFIG, "float32", shared_embedding=True).build_all()
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    batch = features([[5, 6, 7, 0]], [[1, 10, 11, 12]])
    assert np.array_equal(fresh(batch).numpy(), model(batch).numpy())


def test_the_cached_decoder_gives_the_full_pass_logits(model):
    source = np.array([[5, 6, 7, 8, 9, 0]], np.int32)
    target = np.array([[1, 10, 11, 12, 13]], np.int32)
    full = model(features(source, target)).numpy()[0]
    memory = model.encode(source, source != 0)
    state = model.start_state(memory, source != 0, max_length=8)
    for i in range(target.shape[1]):
        logits, state = model.decode_step(tf.constant(target[:, i]), tf.constant(i), state)
        assert np.allclose(logits.numpy()[0], full[i], atol=1e-5), f"position {i}"


# A toy model over pieces PAD 0, START 1, END 2, A 3, B 4: the next piece's probabilities
# depend on the position and the last piece. Greedy takes A (0.6), then A (0.36), then END
# (1.0): 0.216. The best output is B END: 0.4 x 0.9 = 0.36 (A END: 0.6 x 0.3 = 0.18).
ENDS = [0.0, 0.0, 1.0, 0.0, 0.0]
NEXT = [
    {1: [0.0, 0.0, 0.0, 0.6, 0.4]},  # position 0, after START
    {3: [0.0, 0.0, 0.3, 0.36, 0.34], 4: [0.0, 0.0, 0.9, 0.05, 0.05]},  # position 1, after A or B
    {},  # position 2 and later: END
]


class ToyModel:
    target_vocabulary_size = 5

    def __init__(self):
        table = np.array([[step.get(last, ENDS) for last in range(5)] for step in NEXT], np.float32)
        self.log_table = tf.constant(np.log(np.maximum(table, 1e-12)))  # (position, last piece, next piece)

    def encode(self, source_ids, source_mask):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0))

    def start_state(self, memory, source_mask, max_length):
        return {"memory_mask": tf.cast(source_mask, tf.bool), "layers": []}

    def decode_step(self, token_ids, index, state):
        return tf.gather(self.log_table[tf.minimum(index, 2)], token_ids), state


@pytest.mark.parametrize("jit_compile", [False, True])
def test_beam_search_finds_the_better_output_greedy_misses(jit_compile):
    source = np.ones((2, 3), np.int32)
    greedy = Search(ToyModel(), 6, 1, 2, beam_size=1, jit_compile=jit_compile)(source, source != 0)
    assert greedy.tolist() == [[3, 3, 2, 0, 0, 0]] * 2  # A A END, then padding
    beam = Search(ToyModel(), 6, 1, 2, beam_size=2, length_penalty=0.0, jit_compile=jit_compile)(source, source != 0)
    assert beam[:, :2].tolist() == [[4, 2]] * 2  # B END
    assert math.log(0.4 * 0.9) > math.log(0.6 * 0.36 * 1.0)  # what the beam was right about


def test_a_length_penalty_can_prefer_a_longer_output():
    # GNMT's score is log p / ((5 + length) / 6) ** alpha: with alpha 6, A A END (0.216,
    # 3 pieces) scores -0.273 and B END (0.36, 2 pieces) -0.405.
    alpha = 6.0
    assert math.log(0.216) / (8 / 6) ** alpha > math.log(0.36) / (7 / 6) ** alpha
    source = np.ones((1, 3), np.int32)
    beam = Search(ToyModel(), 6, 1, 2, beam_size=2, length_penalty=alpha)(source, source != 0)
    assert beam[0, :3].tolist() == [3, 3, 2]


def test_an_output_that_never_ends_stops_at_max_length():
    class Endless(ToyModel):
        def decode_step(self, token_ids, index, state):
            logits = tf.one_hot(tf.fill(tf.shape(token_ids), 3), 5) * 10.0  # always A
            return logits, state

    source = np.ones((1, 2), np.int32)
    assert Search(Endless(), 4, 1, 2, beam_size=1)(source, source != 0).tolist() == [[3, 3, 3, 3]]
    assert Search(Endless(), 4, 1, 2, beam_size=3)(source, source != 0).tolist() == [[3, 3, 3, 3]]


def test_banned_pieces_are_never_written():
    source = np.ones((1, 2), np.int32)
    # Ban A: greedy must take B, then END.
    assert Search(ToyModel(), 4, 1, 2, beam_size=1, banned_ids=(3,))(source, source != 0).tolist() == [[4, 2, 0, 0]]


@pytest.mark.slow
def test_search_on_the_real_model_compiles_under_xla_and_agrees_with_eager(model):
    source = np.array([[5, 6, 7, 0], [8, 9, 10, 11]], np.int32)
    for beam_size in (1, 3):
        compiled = Search(model, 8, 1, 2, beam_size=beam_size, jit_compile=True)(source, source != 0)
        eager = Search(model, 8, 1, 2, beam_size=beam_size, jit_compile=False)(source, source != 0)
        assert compiled.shape == (2, 8)
        assert compiled.tolist() == eager.tolist()
