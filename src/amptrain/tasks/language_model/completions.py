"""A language model's completions a piece at a time, for `amptrain serve`'s OpenAI API:
a prompt's pieces, then each new piece as soon as it is chosen (a server streams it).

    completer = Completer(task, model)                  # a run's or a pretrained folder's
    prompt = completer.chat_prompt([{"role": "user", "content": "Hola"}])   # through the template
    pieces = completer.pieces(prompt, max_new_tokens=32, temperature=0.0)
    for piece in pieces: ...                            # each new piece; pieces.finish_reason: "stop" or "length"

The arithmetic is `generation._loop`'s for one row: where the model decodes lean, the
prompt's positions but its last written into the caches at once, then one position a step,
each step's piece picked by `generation.pick` under the row's key (`prompt_keys`). So a
greedy reply equals `amptrain predict --chat`'s, and a seeded sample equals `generate`'s for
the same prompt and seed. The step is one compiled function (one trace: the caches hold the
model's whole length), called from Python between pieces; the merged, cast kernels are made
once, when the completer is.
"""

import numpy as np
import tensorflow as tf

from amptrain.errors import ConfigError
from amptrain.tasks.language_model import chat, generation


class Completer:
    """`task`'s `model` (a loaded language model) continuing one prompt at a time."""

    def __init__(self, task, model):
        self.task, self.model = task, model
        self.context = int(model.max_length)  # prompt and new pieces, at most
        self.eod_id = int(task.eod_id)
        self.template = None
        if task.checkpoint is not None:
            try:
                self.template = chat.ChatTemplate.from_folder(task.checkpoint.path)
            except ConfigError:  # a folder without a template: completions only
                pass
        self._weights = model.decoding_weights()  # merged and cast once, not a request
        self._step = tf.function(self._step_and_pick, reduce_retracing=True)
        self._prefill = tf.function(
            lambda ids, caches: model.prefill(ids, caches, self._weights), reduce_retracing=True
        )

    def warm_up(self):
        """Traces the step and the prefill (for prompts of any length) by generating once, so
        that the first request waits for no tracing."""
        if self._weights is not None:
            spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, self.model.empty_caches(1, self.context))
            self._prefill.get_concrete_function(tf.TensorSpec((1, None), tf.int32), spec)
        prompt = self.text_prompt("Hello")
        list(self.pieces(prompt[: self.context - 2], max_new_tokens=1))

    def chat_prompt(self, messages):
        """The pieces of `messages` ([{"role", "content"}]) through the model's chat template,
        with the generation prompt (as `predict --chat` encodes them)."""
        if self.template is None:
            raise ConfigError("this model has no chat template; use the completions API")
        return [int(i) for i in self.task.tokenizer.encode([self.template.render(messages, True)])[0]]

    def text_prompt(self, text):
        """The pieces of `text` after those that start a document (as `predict` encodes a prompt)."""
        before = list(self.task.framing[0])
        ids = [int(i) for i in self.task.tokenizer.encode([text])[0]]
        return before + ids if before or ids else [int(self.task.empty_prompt_id)]

    def decode(self, pieces):
        return self.task.tokenizer.decode(np.asarray(pieces, np.int32))

    def pieces(self, prompt, max_new_tokens, temperature=0.0, top_p=1.0, seed=0):
        """The new pieces after `prompt` (a list of ids), one at a time (`Pieces`): greedy at
        temperature 0, else sampled among the most likely whose probabilities sum to `top_p`."""
        settings = generation.Settings(max_new_tokens, float(temperature), 0, float(top_p), int(seed))
        return Pieces(self, list(prompt), settings)

    def _step_and_pick(self, piece, t, caches, temperature, top_p, key):
        logits, caches = self.model.step(piece, t, caches, self._weights)
        return generation.pick(logits, temperature, 0, top_p, key, t), caches


class Pieces:
    """An iterator of the new pieces after a prompt, to the end piece (not given) or to
    `settings.max_new_tokens` or the model's length; `finish_reason` is "stop" at the end
    piece, "length" otherwise (OpenAI's words). `close()` stops it early."""

    def __init__(self, completer, prompt, settings):
        if not 1 <= len(prompt) < completer.context:
            raise ValueError(f"a prompt of {len(prompt)} pieces; expected 1 to {completer.context - 1}")
        self._completer, self._prompt = completer, prompt
        self._settings = settings
        self._limit = min(len(prompt) + settings.max_new_tokens, completer.context)
        self.finish_reason = None
        self._running = self._run()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._running)

    def close(self):
        self._running.close()

    def _run(self):
        c, s, prompt = self._completer, self._settings, self._prompt
        length = len(prompt)
        caches = c.model.empty_caches(1, c.context)
        key = generation.prompt_keys(tf.constant([prompt], tf.int32), tf.constant([length]), tf.constant(s.seed))
        temperature, top_p = tf.constant(s.temperature, tf.float32), tf.constant(s.top_p, tf.float32)
        t = 0
        if c._weights is not None and length > 1:  # lean decoding: all of the prompt but its last at once
            caches = c._prefill(tf.constant([prompt[:-1]], tf.int32), caches)
            t = length - 1
        fed = prompt[t]
        while True:
            chosen, caches = c._step(tf.constant([fed], tf.int32), tf.constant(t), caches, temperature, top_p, key)
            t += 1
            if t < length:  # still inside the prompt (a family that steps through it)
                fed = prompt[t]
                continue
            fed = int(chosen[0])
            if fed == c.eod_id:
                self.finish_reason = "stop"
                return
            yield fed
            if t + 1 >= self._limit:
                self.finish_reason = "length"
                return
