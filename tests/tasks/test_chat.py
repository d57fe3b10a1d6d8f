"""Chat data (tasks/language_model/chat.py): conversations read from JSONL with file:line
errors, rendered in `transformers`' sandbox, and the replies alone scored. The ids against
`transformers`' `apply_chat_template` on SmolLM2 are in tests/pretrained/test_smollm2.py."""

import json
import os

import pytest
from tokenizers import Tokenizer

from amptrain.errors import ConfigError, DataError
from amptrain.tasks.language_model.chat import ChatTemplate, encode_conversation, read_chat

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pretrained")
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:\n{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Answer in Spanish."},
    {"role": "user", "content": "In the beginning"},
    {"role": "assistant", "content": "En el principio"},
    {"role": "user", "content": "God created"},
    {"role": "assistant", "content": "creó Dios"},
]


def write_lines(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records))
    return str(path)


def test_both_formats_are_read_and_told_apart_by_their_keys(tmp_path):
    path = write_lines(
        tmp_path / "train.jsonl", [{"messages": CONVERSATION}, {"prompt": "Hola", "completion": "Hello"}]
    )
    first, second = read_chat(path)
    assert first == CONVERSATION
    assert second == [{"role": "user", "content": "Hola"}, {"role": "assistant", "content": "Hello"}]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        ('["a", "list"]', r"bad\.jsonl:2: expected a JSON object, received list"),
        ('{"text": "plain"}', r"bad\.jsonl:2: expected the key messages, or prompt and completion; found text"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', r"bad\.jsonl:2: messages\[0\]\.role: expected one of"),
        ('{"messages": [{"role": "user", "content": 3}]}', r"bad\.jsonl:2: messages\[0\]\.content: expected a string"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', r"bad\.jsonl:2: no assistant message"),
        ('{"prompt": "hi", "completion": null}', r"bad\.jsonl:2: prompt and completion: expected strings"),
    ],
)
def test_a_bad_line_is_one_error_naming_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", [{"prompt": "a", "completion": "b"}, line])
    with pytest.raises(DataError, match=message):
        read_chat(path)


def test_replies_and_their_end_pieces_are_the_scored_pieces():
    tokenizer = Tokenizer.from_file(os.path.join(TINY, "tiny-gpt2", "tokenizer.json"))
    template = ChatTemplate(TEMPLATE)
    ids, scored = encode_conversation(template, tokenizer, CONVERSATION, "<|endoftext|>")
    assert ids == tokenizer.encode(template.render(CONVERSATION), add_special_tokens=False).ids
    replies = [i for i, s in zip(ids, scored) if s]
    assert tokenizer.decode(replies, skip_special_tokens=False) == "En el principio<|endoftext|>creó Dios<|endoftext|>"
    alone = [tokenizer.encode(f"{m['content']}<|endoftext|>").ids for m in CONVERSATION if m["role"] == "assistant"]
    assert sum(scored) == sum(map(len, alone))  # counted: exactly the replies' pieces
    _, everything = encode_conversation(template, tokenizer, CONVERSATION, "<|endoftext|>", score_all=True)
    assert all(everything)


def test_a_piece_across_a_replys_start_is_the_replys():
    """ ": En" splits as ":", " En": the piece holding the reply's first letter is scored."""
    tokenizer = Tokenizer.from_file(os.path.join(TINY, "tiny-gpt2", "tokenizer.json"))
    template = ChatTemplate(TEMPLATE.replace(":\n", ": "))
    ids, scored = encode_conversation(template, tokenizer, CONVERSATION, "<|endoftext|>")
    replies = tokenizer.decode([i for i, s in zip(ids, scored) if s], skip_special_tokens=False)
    assert replies == " En el principio<|endoftext|> creó Dios<|endoftext|>"


def test_a_template_that_reaches_outside_its_sandbox_is_refused():
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", origin="evil.jinja")
    with pytest.raises(ConfigError, match=r"evil\.jinja: the template reaches outside its sandbox"):
        escape.render(CONVERSATION)
    with pytest.raises(ConfigError, match=r"ns\.jinja: the template reaches outside its sandbox"):
        ChatTemplate("{% set ns = namespace(_hidden=1) %}{{ ns }}", origin="ns.jinja").render(CONVERSATION)
    with pytest.raises(ConfigError, match=r"broken\.jinja:1: not a Jinja template"):
        ChatTemplate("{% for m in messages %}", origin="broken.jinja")
    with pytest.raises(DataError, match=r"strict\.jinja: the template refused a conversation: no system"):
        ChatTemplate("{{ raise_exception('no system') }}", origin="strict.jinja").render(CONVERSATION)


def test_transformers_globals_and_filters_render():
    source = "{{ messages[0] | tojson }}|{{ dict(a=1)['a'] }}|{% generation %}{{ eos_token }}{% endgeneration %}"
    text = ChatTemplate(source, {"eos_token": "</s>"}).render([{"role": "user", "content": "¿Qué?"}])
    assert text == '{"role": "user", "content": "¿Qué?"}|1|</s>'


def test_packed_blocks_score_the_next_piece_where_it_is_a_replys():
    """Two conversations in one block of 8, the third in a second; a conversation longer than a
    block is cut after its last reply that fits, and one whose first reply does not fit is dropped."""
    from amptrain.tasks.language_model.chat import pack

    first = ([10, 11, 12, 13], [0, 0, 1, 1])  # a prompt of two pieces, a reply of two
    second = ([20, 21, 22], [0, 1, 1])
    third = ([30, 31, 32, 33, 34, 35, 36, 37, 38, 39], [0, 1, 1, 0, 0, 1, 1, 0, 1, 1])  # 10 > 8: cut at 7
    alone = ([40] * 9 + [41], [0] * 9 + [1])  # its one reply starts past the block
    arrays, stats = pack([first, second, third, alone], 8)
    assert arrays["token_ids"].tolist() == [[10, 11, 12, 13, 20, 21, 22, 0], [30, 31, 32, 33, 34, 35, 36, 0]]
    assert arrays["labels"].tolist() == [[-1, 12, 13, -1, 21, 22, -1, -1], [31, 32, -1, -1, 35, 36, -1, -1]]
    assert arrays["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0, 0, -1]]
    assert arrays["positions"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert stats == {"conversations": 3, "cut": 1, "dropped": 1, "tokens_seen": 14, "tokens_scored": 8, "padding": 2}


def test_the_shipped_conversations_read_and_share_no_verse():
    data = os.path.join(os.path.dirname(TINY), "..", "data", "chat-en-es")
    splits = {name: read_chat(os.path.join(data, f"{name}.jsonl")) for name in ("train", "dev", "test")}
    assert {name: len(c) for name, c in splits.items()} == {"train": 4000, "dev": 100, "test": 200}
    prompts = {name: {c[0]["content"] for c in conversations} for name, conversations in splits.items()}
    assert (
        not prompts["train"] & prompts["test"]
        and not prompts["train"] & prompts["dev"]
        and not prompts["dev"] & prompts["test"]
    )
    assert all(c[0]["content"].startswith("Translate into Spanish: ") for c in splits["test"])


@pytest.mark.parametrize("family", ["llama3", "qwen2", "gemma"])
def test_the_families_real_templates_give_apply_chat_templates_ids(family):
    """The tiny folders with Llama 3's, Qwen2's and Gemma's own templates (a bos token, a default
    system prompt, trimmed contents, Gemma's refusal of a system turn): `transformers`' ids
    (make_chat_templates.py), and the replies' pieces counted."""
    with open(os.path.join(TINY, "reference-chat-templates.json"), encoding="utf-8") as f:
        records = json.load(f)[family]
    folder = os.path.join(TINY, f"tiny-{family}")
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    template = ChatTemplate.from_folder(folder)
    for record in records:
        ids, scored = encode_conversation(template, tokenizer, record["messages"], record["end_token"])
        prompt = template.render(record["messages"][:-1], add_generation_prompt=True)
        assert ids == record["ids"] and sum(scored) == record["reply_pieces"]
        assert tokenizer.encode(prompt, add_special_tokens=False).ids == record["prompt_ids"]
    if family == "gemma":
        with pytest.raises(DataError, match=r"chat_template\.jinja: the template refused a conversation: System role"):
            template.render([{"role": "system", "content": "x"}, *records[0]["messages"]])


def test_predict_chat_replies_as_predict_continues_the_rendered_prompt(capsys):
    """`predict FOLDER --chat TEXT`: the tiny Qwen2 with its ChatML template; the reply is what
    predict continues the rendered prompt (with the generation prompt) with, and alone is printed."""
    import amptrain
    from amptrain import api
    from amptrain.cli import main

    folder = os.path.join(TINY, "tiny-qwen2")
    settings = ["generate.max_new_tokens=6"]
    (record,) = api.chat(folder, ["Hola"], system="Be brief.", overrides=settings)
    prompt = ChatTemplate.from_folder(folder).render(record["messages"], add_generation_prompt=True)
    assert record["messages"][0] == {"role": "system", "content": "Be brief."}
    assert record["reply"] == amptrain.predict(folder, [prompt], overrides=settings)[0]["generated"]
    assert main(["predict", folder, "--chat", "Hola", "--system", "Be brief.", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out == record["reply"] + "\n"


def test_predict_chat_without_a_template_or_system_without_chat_is_one_line(capsys):
    from amptrain.cli import main

    assert main(["predict", os.path.join(TINY, "tiny-gpt2"), "--chat", "Hola"]) == 2
    assert "tiny-gpt2: no chat template; expected chat_template.jinja" in capsys.readouterr().err
    assert main(["predict", os.path.join(TINY, "tiny-qwen2"), "--text", "Hola", "--system", "x"]) == 2
    assert "--system is for --chat" in capsys.readouterr().err
