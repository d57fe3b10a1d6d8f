"""What the precision did: overflow records, the loss-scale history, and the diagnosis
a run that cannot go on stops with.

    watch = NumericsWatch(trainer, log)
    watch.after_call(totals, step)            # after every graph call
    raise NumericsError(watch.diagnosis(totals["stop"], step, config, last_checkpoint))

The overflow locator works from the per-variable finite flags the graph returns for the
first overflowing step of each call (no check-numerics op, so it runs under XLA). A
non-finite value in the backward pass spreads to every layer below it, so the layers
are listed in forward order and the last of them, the one the backward pass met first,
is named as the `origin`.
"""

import logging

from amptrain.engine.run_log import LOGGER_NAME
from amptrain.engine.sanity import ABSURD_LEARNING_RATE, LossGrowth
from amptrain.engine.step_runner import NONFINITE_LOSS, SCALE_AT_FLOOR, TOO_MANY_SKIPS

logger = logging.getLogger(LOGGER_NAME)

FIRST_RECORDS = 5  # overflow records always written; after them, one per RECORD_EVERY steps
RECORD_EVERY = 100  # ... unless other layers overflow
HISTORY_SHOWN = 12


def layer_name(variable_path):
    """`block_0/attention/qkv/kernel` -> `block_0/attention/qkv`."""
    return variable_path.rsplit("/", 1)[0] if "/" in variable_path else variable_path


class NumericsWatch:
    def __init__(self, trainer, log, config=None):
        self.trainer = trainer
        self.config = config
        self.growth = LossGrowth()
        self.log = log
        self.layers = [layer_name(v.path) for v in trainer.variables]
        self.history = []  # (step, scale) each time the scale is seen to change
        self.overflow_layers = []  # every layer seen overflowing, first seen first
        self.written = 0
        self.last_written_step = None
        self.last_layers = None
        self.unwritten = 0  # overflowing steps since the last record
        self.note_scale(int(trainer.step.numpy()))

    def note_scale(self, step):
        scaler = self.trainer.loss_scale
        if scaler is None:
            return
        scale = float(scaler.scale.numpy())
        if not self.history or self.history[-1][1] != scale:
            self.history.append((step, scale))

    def after_call(self, totals, step):
        if int(totals["overflow_steps"]):
            self.unwritten += int(totals["overflow_steps"])
            self._overflow(totals)
        self.note_scale(step)
        if self.config is not None and int(totals["applied_steps"]):
            self.growth.after_call(float(totals["loss_total"]) / int(totals["applied_steps"]), step, self.config)

    def _overflow(self, totals):
        flags = totals["overflow_variables"]
        layers = list(dict.fromkeys(name for name, bad in zip(self.layers, flags) if bad))
        self.overflow_layers.extend(name for name in layers if name not in self.overflow_layers)
        step = int(totals["overflow_step"])
        new_layers = layers != self.last_layers
        due = self.last_written_step is None or step - self.last_written_step >= RECORD_EVERY
        if not (self.written < FIRST_RECORDS or new_layers or due):
            return
        scale = float(totals["overflow_scale"]) if self.trainer.loss_scale is not None else None
        origin = layers[-1] if layers else None
        self.log.write(
            {
                "kind": "overflow",
                "step": step,
                "loss_scale": scale,
                "layers": layers,
                "origin": origin,
                "overflow_steps": self.unwritten,
            }
        )
        shown = f"loss scale {scale:g}, " if scale is not None else ""
        since = "since the previous report" if self.written else "so far"
        logger.info(
            f"overflow at step {step} ({shown}{self.unwritten} overflowing step(s) {since}): "
            f"non-finite gradients in {len(layers)} layer(s), nearest the output: {origin}"
        )
        self.written += 1
        self.last_written_step, self.last_layers, self.unwritten = step, layers, 0

    def diagnosis(self, reason, step, config, last_checkpoint):
        """Several lines: what happened, the scale history, the layers, what to try."""
        lines = [_what_happened(int(reason), step, config, self.trainer)]
        if self.history:
            shown = (
                self.history
                if len(self.history) <= HISTORY_SHOWN
                else self.history[:1] + self.history[-HISTORY_SHOWN + 1 :]
            )
            lines.append("loss scale history (step: scale): " + ", ".join(f"{s}: {v:g}" for s, v in shown))
        if self.overflow_layers:
            lines.append(
                f"layers whose gradients were non-finite ({len(self.overflow_layers)}, forward order): "
                + ", ".join(self.overflow_layers[:20])
                + (" ..." if len(self.overflow_layers) > 20 else "")
            )
        lines.append(f"the last good checkpoint is kept as it was: {last_checkpoint or 'none yet'}")
        lines.append("what to try:")
        lines.extend(_advice(config, self.trainer, self.overflow_layers))
        return "\n".join(lines)


def _advice(config, trainer, overflow_layers):
    """What to try, fitted to the run: no bf16 or float32 pinning for a run already in float32
    (its overflow is not the precision's), no bf16 for a bf16 run, and the learning rate first
    when it is absurd (`sanity.ABSURD_LEARNING_RATE`)."""
    p, t = config.precision, config.train
    policy = p.policy
    absurd = t.learning_rate > ABSURD_LEARNING_RATE
    far = ": far above Adam's usual 1e-5 .. 1e-2" if absurd else ""
    learning_rate = (
        f"  - a lower train.learning_rate (now {t.learning_rate:g}{far}) or train.clip_norm (now {t.clip_norm:g})"
    )
    lines = []
    if absurd or policy == "float32":
        lines.append(learning_rate)
    if trainer.loss_scale is not None and not trainer.loss_scale.dynamic:
        lines.append(f'  - precision.loss_scale = "dynamic" instead of the fixed {float(p.loss_scale):g}')
    if policy == "mixed_float16":
        lines.append(
            '  - precision.policy = "mixed_bfloat16": float32\'s exponent range, no loss scale needed '
            "(fast on GPUs of compute capability >= 8.0, TPUs, CPUs with AMX or AVX512_BF16)"
        )
    if overflow_layers and policy != "float32":
        origin = overflow_layers[-1]
        lines.append(f'  - pin the layer where it began ({origin}) to float32: dtype="float32" on that layer')
    if policy == "float32":
        lines.append("  - the run is in float32 throughout: a value beyond its range points at the data or the model")
    if not (absurd or policy == "float32"):
        lines.append(learning_rate)
    lines.append("  - runtime.check_numerics = true to name the op that first produced the value")
    return lines


def _what_happened(reason, step, config, trainer):
    p = config.precision
    skips = int(trainer.consecutive_skips.numpy())
    if reason == SCALE_AT_FLOOR:
        return (
            f"step {step} overflowed with the loss scale already at precision.min_scale ({p.min_scale:g}): "
            "backing off can do nothing more"
        )
    if reason == TOO_MANY_SKIPS:
        return (
            f"{skips} steps in a row were skipped (precision.max_consecutive_skips = {p.max_consecutive_skips}); "
            f"the last at step {step}"
        )
    if reason == NONFINITE_LOSS:
        restores = f", after {config.train.max_restores} restore(s)" if config.train.on_nonfinite == "restore" else ""
        return (
            f"step {step} had a non-finite loss or gradients (train.on_nonfinite = "
            f'"{config.train.on_nonfinite}"{restores}); the step was not applied'
        )
    return f"training stopped at step {step}"
