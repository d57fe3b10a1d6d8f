"""SmolLM2-135M-Instruct as `make pretrained-llm` converts it from the registry's GGUF file
(amptrain/gguf_files/), against what `transformers` makes of the same file
(reference-smollm2.json, make_smollm2_reference.py): the same ids, float32 logits within
1e-4, the same greedy continuation. Slow (a 135M model), and skipped without the folder."""

import json
import os

import numpy as np
import pytest

import amptrain
from amptrain.config.pretrained import read_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
PRETRAINED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "pretrained")
FOLDER = os.path.join(PRETRAINED, "SmolLM2-135M-Instruct")
GGUF = os.path.join(PRETRAINED, "SmolLM2-135M-Instruct.Q4_1.gguf")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir(FOLDER), reason=f"no {FOLDER} (make pretrained-llm)"),
]


def reference():
    with open(os.path.join(HERE, "reference-smollm2.json"), encoding="utf-8") as f:
        return json.load(f)["texts"]


def test_ids_and_float32_logits_are_transformers_own_gguf_loading():
    from amptrain.tasks.language_model.families import family_of
    from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

    checkpoint = read_checkpoint(FOLDER)
    tokenizer = family_of(checkpoint).tokenizer(checkpoint)
    model = PretrainedLanguageModel(checkpoint, 128, 0.0, "float32")
    for record in reference():
        ids = tokenizer.prefix + tokenizer.encode([record["text"]])[0].tolist()
        assert ids == record["ids"] == record["gguf_tokenizer_ids"]
        batch = np.array([ids], np.int32)
        features = {"token_ids": batch, "segment_ids": np.zeros_like(batch), "positions": np.arange(len(ids))[None]}
        logits = model(features).numpy()[0]
        assert np.abs(logits[:, :32] - np.array(record["logits_first_columns"])).max() < 1e-4
        top = logits[-1][record["last_top_ids"]]
        assert np.abs(top - np.array(record["last_top_logits"])).max() < 1e-4


def test_predict_on_the_folder_and_on_the_gguf_file_continues_as_transformers():
    """Greedy, 20 new pieces; the GGUF file named directly is converted once into the cache."""
    records = reference()
    texts = [r["text"] for r in records]
    for path in (FOLDER, GGUF):
        got = amptrain.predict(path, texts, overrides=["generate.max_new_tokens=20"])
        assert [g["generated"] for g in got] == [r["generated"] for r in records], path


def test_conversations_give_apply_chat_templates_ids_and_score_the_replies_alone():
    """Its ChatML template (a default system turn when none is given), several turns, Unicode;
    the scored pieces are the replies' and their `<|im_end|>`, counted."""
    from tokenizers import Tokenizer

    from amptrain.tasks.language_model.chat import ChatTemplate, encode_conversation

    with open(os.path.join(HERE, "reference-smollm2.json"), encoding="utf-8") as f:
        chats = json.load(f)["chats"]
    tokenizer = Tokenizer.from_file(os.path.join(FOLDER, "tokenizer.json"))
    template = ChatTemplate.from_folder(FOLDER)  # its tokenizer_config.json's special tokens
    assert (template.special_tokens["bos_token"], template.special_tokens["eos_token"]) == (
        "<|im_start|>",
        "<|im_end|>",
    )
    for chat in chats:
        ids, scored = encode_conversation(template, tokenizer, chat["messages"], "<|im_end|>")
        assert ids == chat["ids"] and sum(scored) == chat["reply_pieces"]
        prompt = template.render(chat["messages"][:-1], add_generation_prompt=True)
        assert tokenizer.encode(prompt, add_special_tokens=False).ids == chat["prompt_ids"]
        assert scored[len(chat["prompt_ids"]) :] == [1] * (len(ids) - len(chat["prompt_ids"]) - 1) + [0]


def test_predict_chat_prints_the_reply_alone(capsys):
    from amptrain.cli import main

    text = "Translate into Spanish: In the beginning God created the heaven and the earth."
    assert main(["predict", FOLDER, "--chat", text, "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert out.strip() and "<|im_" not in out and "assistant" not in out and text not in out
