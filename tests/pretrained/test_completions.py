"""A language model's completions a piece at a time (what `amptrain serve` streams) are the
pieces `generate` writes for the same prompt: greedy, and sampled under the same seed; on a
family that decodes lean (a prefill, then a position a step) and on one stepping through its
prompt (GPT-2, keras-hub's cached call); stopped at `max_new_tokens`."""

import pytest
from pretrained.test_causal import folder

from amptrain.api import load_run
from amptrain.tasks.language_model import generation
from amptrain.tasks.language_model.completions import Completer


# Llama 3 (lean) is slow: the served run checks its path against `predict` end to end
@pytest.mark.parametrize("family", [pytest.param("llama3", marks=pytest.mark.slow), "gpt2"])
def test_pieces_one_at_a_time_are_the_pieces_generate_writes(family):
    task, model, _, _ = load_run(folder(family), ())
    completer = Completer(task, model)
    if family == "llama3":  # through its chat template
        prompt = completer.chat_prompt([{"role": "user", "content": "Hola"}])
    else:
        prompt = completer.text_prompt("And God said")
    for temperature, top_p, seed in ((0.0, 1.0, 0), (0.9, 0.8, 5)):
        pieces = completer.pieces(prompt, 10, temperature, top_p, seed)
        got = list(pieces)
        settings = generation.Settings(10, temperature, 0, top_p, seed)
        padded, lengths = generation.padded_prompts([prompt])
        out = generation.generate(model, padded, lengths, task.eod_id, settings).numpy()
        assert got == generation.continuation(out[0], lengths[0], task.eod_id).tolist()
        assert pieces.finish_reason == ("length" if len(got) == 10 else "stop")
