"""Blocks of pieces, the language model's batches: which blocks make batch N (`BlockPlan`),
each piece's document and position within a packed row, and the scores of a split.

    plan = BlockPlan(num_blocks, rows, length, seed, shuffle=True)
    indices, length = plan.batch(step)                          # -1: a padding row
    segments, positions = segments_and_positions(starts, real)  # restart at each document
"""

import math

import numpy as np


class BlockPlan:
    """Which blocks make batch N: a permutation of the blocks an epoch seeded by (seed, epoch),
    `rows` a batch (the last ones short of a batch are left for the next epoch's order), or
    every block once in order (`shuffle=False`, the last batch padded with -1)."""

    def __init__(self, num_blocks, rows, length, seed, shuffle):
        self.num_blocks, self.rows, self.length, self.seed, self.shuffle = num_blocks, rows, length, seed, shuffle
        self.steps_per_epoch = max(1, num_blocks // rows) if shuffle else -(-num_blocks // rows)
        self._order = None

    def batch(self, step):
        epoch, within = divmod(step, self.steps_per_epoch)
        if self.shuffle:
            if self._order is None or self._order[0] != epoch:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_blocks)
                self._order = (epoch, order)
            indices = self._order[1][within * self.rows : (within + 1) * self.rows]
        else:
            indices = np.arange(within * self.rows, min((within + 1) * self.rows, self.num_blocks))
        padded = np.full(self.rows, -1, np.int64)
        padded[: len(indices)] = indices
        return padded, self.length


def segments_and_positions(starts, real):
    """Each piece's document number within its row (from 0; a new one where `starts`, the
    start of the next) and its position from its document's start; padding -1, 0."""
    segments = np.cumsum(starts, axis=1).astype(np.int32)
    columns = np.arange(starts.shape[1])
    last_start = np.maximum.accumulate(np.where(starts, columns, 0), axis=1)
    positions = (columns - last_start).astype(np.int32)
    return np.where(real, segments, -1), np.where(real, positions, 0)


def scores(nats, count, size):
    """Loss and perplexity per piece, bits per byte, and what they were taken over."""
    loss = nats / max(count, 1)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_byte": nats / math.log(2) / max(size, 1),
        "bytes": int(size),
        "tokens": int(count),
    }
