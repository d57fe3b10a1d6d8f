"""Continuing prompts: greedy, or sampled with a temperature, top-k and top-p under a seed, a
position a step over cached keys and values, in one fixed-shape loop that XLA compiles once.

    settings = Settings(max_new_tokens=64, temperature=0.8, top_k=40, top_p=0.95, seed=1)
    out = generate(model, prompt_ids, prompt_lengths, eod_id, settings)   # (batch, length) ids, -1 after
    continuation(out[i], prompt_lengths[i], eod_id)                         # row i's new pieces

Each prompt starts with the end-of-document piece (a document's start in training). Step t
feeds the piece at position t (the prompt's while t is inside it, else the one generated)
and, from the prompt's last position on, picks the next: a row stops at the end-of-document
piece or after `max_new_tokens`, and the loop when every row has, or at the model's length.
The same seed gives the same text, whatever else is in the batch: each row samples from a
stream of its own, `stateless_categorical` keyed by (a hash of the seed and the row's
prompt ids, t), so a prompt continues alike alone, beside others, or served under load.
Positions past a row's prompt and continuation hold -1 (a pretrained model's id 0 is a
piece like any other); the model is fed 0 there, and nothing it computes from it is kept.
Where the model decodes lean (a pretrained Llama or Qwen2: `families/decoding.py`), the
positions before the shortest prompt's last are written into the caches in one pass first,
and the loop starts there. `greedy_by_recomputing` runs the whole prefix again each step,
the slow reference the cached loop must equal.
"""

import dataclasses

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Settings:
    """`[generate]`: how `predict` and the export continue a prompt."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy, the most likely piece each step
    top_k: int = 0  # > 0: sample among the k most likely pieces only
    top_p: float = 1.0  # < 1: sample among the most likely pieces whose probabilities sum to top_p
    seed: int = 0


def check(settings, context=None, before=0):
    """Refuses, in one line naming the key, a setting no generation can honour: no new piece,
    a temperature that is not a finite number >= 0, top-k below 0, top-p outside (0, 1];
    with `context` (the model's length), more new pieces than it leaves after the prompt's
    first piece and the `before` pieces the framing puts ahead of it."""
    from amptrain.config import require

    g = settings
    require(isinstance(g.max_new_tokens, int) and g.max_new_tokens >= 1, KEYS[0], "an integer >= 1", g.max_new_tokens)
    if context is not None:
        most = context - 1 - before
        require(
            g.max_new_tokens <= most,
            KEYS[0],
            f"an integer from 1 to {most} (the model's context, data.max_length = {context}, less the prompt's "
            "first piece)",
            g.max_new_tokens,
        )
    require(0 <= g.temperature < float("inf"), KEYS[1], "a finite number >= 0 (0: greedy)", g.temperature)
    require(isinstance(g.top_k, int) and g.top_k >= 0, KEYS[2], "an integer >= 0 (0: every piece)", g.top_k)
    require(0 < g.top_p <= 1, KEYS[3], "a number in (0, 1]", g.top_p)
    require(isinstance(g.seed, int) and -(2**31) <= g.seed < 2**31, KEYS[4], "a 32-bit integer", g.seed)


KEYS = tuple(f"generate.{field.name}" for field in dataclasses.fields(Settings))


def generate(model, prompt_ids, prompt_lengths, eod_id, settings, weights=None):
    """(batch, length) int32: each row its prompt, then its continuation, then -1.
    `prompt_ids` (batch, length of the longest prompt); the settings as tensors or numbers.
    The decoding weights (`weights`: `model.decoding_weights()`, made here when not given;
    batches of one generation share them) are made eagerly and handed to the traced loop:
    made inside it, a quantized base's kernels (read off its call on an identity matrix) left
    1.2 GiB of SmolLM2's int4 graph alive after the generation.

    Traced once for any batch and prompt length: left to `reduce_retracing`, the first call's
    shapes were traced, then the second's relaxed, and each trace kept its graph (230–310 MiB
    for SmolLM2, measured after a 2-piece generation; a chat run's whole peak)."""
    tensors = (
        tf.convert_to_tensor(prompt_ids, tf.int32),
        tf.convert_to_tensor(prompt_lengths, tf.int32),
        tf.constant(eod_id, tf.int32),
        *(tf.convert_to_tensor(v, d) for v, d in zip(dataclasses.astuple(settings), SETTING_DTYPES)),
    )
    weights = model.decoding_weights() if weights is None else weights
    relaxed = (tf.TensorSpec([None] * t.shape.rank, t.dtype) for t in tensors)
    _generate.get_concrete_function(model, *relaxed, weights=weights)  # a lookup once traced
    return _generate(model, *tensors, weights=weights)


SETTING_DTYPES = (tf.int32, tf.float32, tf.int32, tf.float32, tf.int32)


def graph_generate(model, prompt_ids, prompt_lengths, eod_id, max_new, temperature, top_k, top_p, seed):
    """`generate` inside a graph being traced (the export's): every argument a tensor, the
    decoding weights made in the graph."""
    weights = model.decoding_weights()
    return _loop(model, prompt_ids, prompt_lengths, eod_id, max_new, temperature, top_k, top_p, seed, weights)


@tf.function(autograph=False, reduce_retracing=True)
def _generate(model, prompt_ids, prompt_lengths, eod_id, max_new, temperature, top_k, top_p, seed, weights):
    return _loop(model, prompt_ids, prompt_lengths, eod_id, max_new, temperature, top_k, top_p, seed, weights)


def _loop(model, prompt_ids, prompt_lengths, eod_id, max_new, temperature, top_k, top_p, seed, weights):
    """`weights`: `model.decoding_weights()`, made once before the loop (merged, cast kernels of
    pretrained Llama and Qwen2; None for the other models)."""
    batch = tf.shape(prompt_ids)[0]
    length = model.max_length
    out = tf.pad(prompt_ids, [[0, 0], [0, length - tf.shape(prompt_ids)[1]]])[:, :length]
    out = tf.where(tf.range(length)[None] < prompt_lengths[:, None], out, -1)
    limit = tf.minimum(prompt_lengths + max_new, length)  # a row's length at most
    # Positions past the longest row's limit are never written or read: the caches stop there
    # (the chat config's test: prompts of a few dozen pieces and 96 new ones, of 256 positions).
    caches = model.empty_caches(batch, tf.reduce_max(limit))
    keys = prompt_keys(out, prompt_lengths, seed)

    def running(t, out, done, caches):
        return tf.logical_and(t < length - 1, tf.logical_not(tf.reduce_all(done)))

    def step(t, out, done, caches):
        logits, caches = model.step(tf.maximum(out[:, t], 0), t, caches, weights)
        chosen = pick(logits, temperature, top_k, top_p, keys, t)
        writes = tf.logical_and(t + 1 >= prompt_lengths, tf.logical_not(done))  # past the prompt, still going
        writes = tf.logical_and(writes, t + 1 < limit)
        column = tf.cast(tf.range(length) == t + 1, tf.int32)[None]
        new = tf.where(writes, chosen, -1)[:, None]
        out = tf.where(tf.logical_and(column > 0, writes[:, None]), new, out)
        done = tf.logical_or(done, tf.logical_and(writes, chosen == eod_id))
        done = tf.logical_or(done, t + 2 >= limit)
        return t + 1, out, done, caches

    done = prompt_lengths >= limit
    start = tf.constant(0)
    if weights is not None:  # lean decoding: the positions every prompt still holds written at once
        start = tf.maximum(tf.reduce_min(prompt_lengths) - 1, 0)
        caches = model.prefill(tf.maximum(out[:, :start], 0), caches, weights)
    _, out, _, _ = tf.while_loop(running, step, (start, out, done, caches))
    return out


def padded_prompts(encoded):
    """(batch, longest) int32 prompt ids, rows padded with -1, and each prompt's length:
    what `generate` takes."""
    lengths = np.array([len(ids) for ids in encoded], np.int32)
    prompts = np.full((len(encoded), max(1, lengths.max())), -1, np.int32)
    for row, ids in enumerate(encoded):
        prompts[row, : len(ids)] = ids
    return prompts, lengths


def prompt_keys(prompt_ids, prompt_lengths, seed):
    """(batch,) int32: each row's sampling key, a 64-bit fingerprint (the same in every process)
    of the seed and the row's prompt ids, padding left out."""
    valid = tf.range(tf.shape(prompt_ids)[1])[None] < prompt_lengths[:, None]
    words = tf.where(valid, tf.strings.as_string(prompt_ids) + ",", "")
    keyed = tf.strings.join([tf.strings.as_string(seed), ":", tf.strings.reduce_join(words, axis=1)])
    return tf.cast(tf.strings.to_hash_bucket_fast(keyed, 2**31 - 1), tf.int32)


def pick(logits, temperature, top_k, top_p, keys, t):
    """The next piece of each row: the argmax when `temperature` is 0, else a sample of
    softmax(logits / temperature) kept to the `top_k` most likely (0: all) and to the most
    likely whose probabilities sum to `top_p`, drawn from the row's own stream (`keys`, at step `t`).
    Greedy steps skip the sampling's sort and draws (a third of a step's time at 16 rows)."""
    greedy = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return tf.cond(temperature > 0, lambda: _sample(logits, temperature, top_k, top_p, keys, t), lambda: greedy)


def _sample(logits, temperature, top_k, top_p, keys, t):
    scaled = logits / tf.maximum(temperature, 1e-6)
    vocabulary = tf.shape(logits)[-1]
    k = tf.where(top_k > 0, tf.minimum(top_k, vocabulary), vocabulary)
    ordered = tf.sort(scaled, axis=-1, direction="DESCENDING")
    kth = tf.gather(ordered, k - 1, axis=-1)[:, None]
    probabilities = tf.nn.softmax(ordered, axis=-1)
    before = tf.cumsum(probabilities, axis=-1, exclusive=True)  # the mass of the more likely ones
    kept = tf.where(before < top_p, ordered, tf.fill(tf.shape(ordered), np.float32(np.inf)))
    floor = tf.reduce_min(kept, axis=-1, keepdims=True)  # the least likely logit top_p keeps
    cut = tf.maximum(kth, floor)
    masked = tf.where(scaled >= cut, scaled, tf.fill(tf.shape(scaled), np.float32(-np.inf)))
    seeds = tf.stack([keys, tf.fill(tf.shape(keys), t)], axis=1)  # (batch, 2): a stream a row

    def draw(row):
        return tf.cast(tf.random.stateless_categorical(row[0][None], 1, row[1])[0, 0], tf.int32)

    return tf.map_fn(draw, (masked, seeds), fn_output_signature=tf.int32)


def continuation(row, prompt_length, eod_id):
    """The pieces `generate` wrote after a prompt of `prompt_length`, up to the end of document."""
    row = np.asarray(row)[prompt_length:]
    ends = np.flatnonzero((row == eod_id) | (row < 0))
    return row[: ends[0]] if len(ends) else row


def greedy_by_recomputing(model, prompt, eod_id, max_new_tokens):
    """Greedy pieces after `prompt` (1-D ids, starting with the end-of-document piece), each
    step running the model over the whole prefix again: no cache, the reference."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        if len(ids) >= model.max_length:
            break
        length = len(ids)
        features = {
            "token_ids": tf.constant([ids], tf.int32),
            "segment_ids": tf.zeros((1, length), tf.int32),
            "positions": tf.range(length, dtype=tf.int32)[None],
        }
        chosen = int(tf.argmax(model(features, training=False)[0, -1]))
        ids.append(chosen)
        if chosen == eod_id:
            break
    return np.array(ids[len(prompt) :], np.int32)
