"""Runs that would train without an error and report nonsense, named before or while they train.

    warn_about_config(config.train)    # before training: an absurd learning rate
    watch = LossGrowth(); watch.after_call(loss, step, config)   # a loss that grows by orders of magnitude

Adam's step is about the learning rate whatever the gradient's size, so `learning_rate =
1000` moves every weight by ~1000 a step: float32 does not overflow, the loss reaches 2e9,
the run exits 0 with a test accuracy below chance. Neither check stops the run (a user may
mean it); each says so in one line, in `train.log` and on the terminal.
"""

import logging
import math

logger = logging.getLogger("amptrain")

ABSURD_LEARNING_RATE = 0.1  # Adam(W) recipes for Transformers use 1e-5 .. 1e-2
GROWTH = 100.0  # the loss this many times its first value: diverging, not noise


def absurd_learning_rate(t):
    """The (key, value) of a learning rate of the `[train]` section `t` above ABSURD_LEARNING_RATE, or None."""
    for key, value in (("train.learning_rate", t.learning_rate), ("train.head_learning_rate", t.head_learning_rate)):
        if value > ABSURD_LEARNING_RATE:
            return key, value
    return None


def warn_about_config(train):
    absurd = absurd_learning_rate(train)
    if absurd:
        key, value = absurd
        logger.warning(
            f"{key} = {value:g} is far above what Adam trains a Transformer with (1e-5 .. 1e-2): "
            "every step moves each weight by about that much, and the loss will likely diverge"
        )


class LossGrowth:
    """Warns once when a call's mean loss grows past GROWTH times the first finite one."""

    def __init__(self):
        self.first = None
        self.warned = False

    def after_call(self, loss, step, config):
        if not math.isfinite(loss) or self.warned:
            return
        if self.first is None:
            self.first = max(loss, 1e-6)
            return
        if loss > GROWTH * self.first:
            self.warned = True
            logger.warning(
                f"the loss at step {step} ({loss:.3g}) is {loss / self.first:,.0f} times its first value "
                f"({self.first:.3g}): training is diverging under {config.precision.policy} "
                f"(train.learning_rate {config.train.learning_rate:g}); lower it, or set train.clip_norm"
            )
