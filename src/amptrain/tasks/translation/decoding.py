"""Greedy and beam search over a `Translator`, in fixed-shape loops that compile under XLA.

    search = Search(model, max_length=64, start_id=2, end_id=3, beam_size=4, length_penalty=0.6,
                    jit_compile=True)
    pieces = search(source_ids, source_mask)   # numpy (batch, max_length): each row ends at its end piece

Both loops run `model.decode_step` once a position, with the decoder's keys and values
cached (so a step costs one position), and stop early once every sentence is done. Every
tensor keeps its shape from step to step: the loop is a `tf.while_loop` that XLA compiles
whole, once per source shape.

Beam search keeps `beam_size` live hypotheses a sentence and the `beam_size` best finished
ones. Each step extends every live hypothesis by every piece, keeps the 2·beam_size best
extensions (so that beam_size of them are still live even if all the others end here),
files those that end into the finished set, scored by log-probability divided by GNMT's
length penalty ((5 + length) / 6) ** alpha, and reorders the caches to follow their
parents. A sentence is done when it has beam_size finished hypotheses and none of its
live ones could still beat the worst of them (log-probabilities only fall, and the
penalty is largest at max_length). At max_length the best live hypothesis, cut there,
competes with the finished ones on its score so far.
"""

import numpy as np
import tensorflow as tf

FAR_BELOW = -1e9  # the score of an impossible hypothesis (finite: -inf - -inf would be NaN)


class Search:
    def __init__(
        self, model, max_length, start_id, end_id, beam_size=1, length_penalty=0.6, jit_compile=False, banned_ids=()
    ):
        self.model = model
        self.max_length = max_length
        self.start_id, self.end_id = start_id, end_id
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        # Pieces never to write (padding, the start piece): their logits are pushed far down.
        bias = np.zeros(model.target_vocabulary_size, np.float32)
        bias[list(banned_ids)] = FAR_BELOW
        self.logit_bias = tf.constant(bias)
        self._search = tf.function(self.ops, jit_compile=jit_compile, reduce_retracing=True)

    def __call__(self, source_ids, source_mask):
        return self._search(tf.constant(source_ids, tf.int32), tf.constant(source_mask, tf.bool)).numpy()

    def ops(self, source_ids, source_mask):
        """The search as TensorFlow ops on tensors: (batch, max_length) int32 pieces. An
        export (`amptrain.tasks.translation.serving`) calls this inside the graph it saves."""
        return self._greedy(source_ids, source_mask) if self.beam_size == 1 else self._beam(source_ids, source_mask)

    def _log_probabilities(self, token_ids, index, state):
        logits, state = self.model.decode_step(token_ids, index, state)
        return tf.nn.log_softmax(tf.cast(logits, tf.float32) + self.logit_bias), state

    def _greedy(self, source_ids, source_mask):
        batch, length = tf.shape(source_ids)[0], self.max_length
        memory = self.model.encode(source_ids, source_mask)
        state = self.model.start_state(memory, source_mask, length)
        positions = tf.range(length)

        def body(i, last, pieces, done, state):
            log_probabilities, state = self._log_probabilities(last, i, state)
            chosen = tf.argmax(log_probabilities, axis=-1, output_type=tf.int32)
            chosen = tf.where(done, tf.zeros_like(chosen), chosen)  # padding after the end
            pieces = tf.where(positions[None] == i, chosen[:, None], pieces)
            return i + 1, chosen, pieces, tf.logical_or(done, chosen == self.end_id), state

        def not_done(i, last, pieces, done, state):
            return tf.logical_and(i < length, tf.logical_not(tf.reduce_all(done)))

        start = (
            tf.constant(0),
            tf.fill([batch], self.start_id),
            tf.zeros([batch, length], tf.int32),
            tf.zeros([batch], tf.bool),
            state,
        )
        _, _, pieces, _, _ = tf.while_loop(not_done, body, start)
        return pieces

    def _penalty(self, length):
        return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, self.length_penalty)

    def _beam(self, source_ids, source_mask):
        """Beam search in one `tf.while_loop`: the start, one step a position, the stop
        test and the choice at the end are the phases below."""
        batch = tf.shape(source_ids)[0]

        def body(i, last, alive, alive_scores, finished, finished_scores, finished_flags, state):
            return self._beam_step(
                batch, i, last, alive, alive_scores, finished, finished_scores, finished_flags, state
            )

        start = self._beam_start(source_ids, source_mask)
        _, _, alive, alive_scores, finished, finished_scores, finished_flags, _ = tf.while_loop(
            self._beam_not_done, body, start
        )
        return self._beam_best(alive, alive_scores, finished, finished_scores, finished_flags)

    def _beam_start(self, source_ids, source_mask):
        """The loop's variables before the first step."""
        k, length = self.beam_size, self.max_length
        batch = tf.shape(source_ids)[0]
        # Every sentence's encoder output once, then one copy a beam (row b * k + j).
        memory = tf.repeat(self.model.encode(source_ids, source_mask), k, axis=0)
        state = self.model.start_state(memory, tf.repeat(source_mask, k, axis=0), length)
        # Only the first beam is live at the start: the others would repeat it.
        alive_scores = tf.tile(tf.constant([[0.0] + [FAR_BELOW] * (k - 1)]), [batch, 1])
        alive = tf.zeros([batch, k, length], tf.int32)
        finished = tf.zeros([batch, k, length], tf.int32)
        finished_scores = tf.fill([batch, k], FAR_BELOW)
        finished_flags = tf.zeros([batch, k], tf.bool)
        return (
            tf.constant(0),
            tf.fill([batch * k], self.start_id),
            alive,
            alive_scores,
            finished,
            finished_scores,
            finished_flags,
            state,
        )

    def _beam_step(self, batch, i, last, alive, alive_scores, finished, finished_scores, finished_flags, state):
        """Position `i`: extends every live hypothesis by every piece, files those that end
        into the finished set and keeps the best k others live, their caches following."""
        k = self.beam_size
        log_probabilities, state = self._log_probabilities(last, i, state)
        vocabulary = tf.shape(log_probabilities)[-1]
        candidates = alive_scores[:, :, None] + tf.reshape(log_probabilities, [batch, k, vocabulary])
        top_scores, top = tf.math.top_k(tf.reshape(candidates, [batch, k * vocabulary]), 2 * k)
        parents, pieces = top // vocabulary, top % vocabulary  # (batch, 2k)
        sequences = tf.gather(alive, parents, batch_dims=1)
        sequences = tf.where(tf.range(self.max_length)[None, None] == i, pieces[:, :, None], sequences)
        ends = tf.equal(pieces, self.end_id)
        # The finished set: the best k of the old ones and those that end here.
        ended_scores = tf.where(ends, top_scores / self._penalty(i + 1), FAR_BELOW)
        pool_scores = tf.concat([finished_scores, ended_scores], axis=1)
        finished_scores, best = tf.math.top_k(pool_scores, k)
        finished = tf.gather(tf.concat([finished, sequences], axis=1), best, batch_dims=1)
        finished_flags = tf.gather(tf.concat([finished_flags, ends], axis=1), best, batch_dims=1)
        # The live set: the best k that do not end.
        alive_scores, best = tf.math.top_k(tf.where(ends, FAR_BELOW, top_scores), k)
        alive = tf.gather(sequences, best, batch_dims=1)
        rows = tf.reshape(tf.gather(parents, best, batch_dims=1) + tf.range(batch)[:, None] * k, [-1])
        state = _reorder_caches(state, rows)
        last = tf.reshape(tf.gather(pieces, best, batch_dims=1), [-1])
        return i + 1, last, alive, alive_scores, finished, finished_scores, finished_flags, state

    def _beam_not_done(self, i, last, alive, alive_scores, finished, finished_scores, finished_flags, state):
        """Whether to go on: below max_length, and some sentence's live hypotheses could
        still beat its worst finished one (or it has fewer than k finished)."""
        best_alive_can_reach = alive_scores[:, 0] / self._penalty(self.max_length)
        worst_finished = tf.reduce_min(tf.where(finished_flags, finished_scores, FAR_BELOW), axis=1)
        done = tf.logical_and(tf.reduce_all(finished_flags, axis=1), worst_finished >= best_alive_can_reach)
        return tf.logical_and(i < self.max_length, tf.logical_not(tf.reduce_all(done)))

    def _beam_best(self, alive, alive_scores, finished, finished_scores, finished_flags):
        """Each sentence's output: its best finished hypothesis, or its best live one."""
        # At max_length the best live hypothesis competes as it stands (cut there); after an
        # early stop its bound is below every finished score, so a finished one wins.
        alive_wins = tf.logical_or(
            tf.logical_not(finished_flags[:, 0]),
            alive_scores[:, 0] / self._penalty(self.max_length) > finished_scores[:, 0],
        )
        return tf.where(alive_wins[:, None], alive[:, 0], finished[:, 0])


def _reorder_caches(state, rows):
    """The decoder state with every layer's self-attention keys and values taken from `rows`
    (the parents of the hypotheses kept); the encoder's keys and values stay."""
    return {
        "memory_mask": state["memory_mask"],
        "layers": [
            {**layer, "key": tf.gather(layer["key"], rows), "value": tf.gather(layer["value"], rows)}
            for layer in state["layers"]
        ],
    }
