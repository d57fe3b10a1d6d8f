"""Chat data in the language-model task (tasks/language_model/conversations.py): the format
told from the content, conversations packed into blocks whose scored positions are exactly
the replies' pieces, the choice of the best checkpoint's score, and the refusals. The runs
(eval on start, generation scores, predict --chat on a run) are in test_chat_runs.py."""

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer

from amptrain.config import config_from_dict
from amptrain.errors import ConfigError, DataError
from amptrain.tasks import create_task
from amptrain.tasks.language_model import generation
from amptrain.tasks.language_model.chat import ChatTemplate, encode_conversation
from amptrain.tasks.language_model.conversations import looks_like_chat

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pretrained", "tiny-qwen2")
CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hola"}, {"role": "assistant", "content": "Hello"}]},
    {"prompt": "Translate: casa", "completion": "house"},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Uno"},
            {"role": "assistant", "content": "One"},
            {"role": "user", "content": "Dos"},
            {"role": "assistant", "content": "Two, señor"},
        ]
    },
]


def chat_task(tmp_path, records=CONVERSATIONS, pretrained=TINY, **train):
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    raw = {
        "task": "language_model",
        "data": {"train": str(path), "dev": str(path), "max_length": 64},
        "model": {"pretrained": pretrained, "dropout": 0.0},
        "train": {"batch_size": 2, **train},
    }
    run = tmp_path / "run"
    run.mkdir()
    return create_task(config_from_dict(raw, source=str(tmp_path)), str(run)), str(path)


def test_the_blocks_score_exactly_the_replies_pieces(tmp_path):
    """Each scored position's label is a reply's piece (or its end piece); their number is
    the replies' pieces that `encode_conversation` marks, counted conversation by conversation."""
    task, path = chat_task(tmp_path)
    task.prepare(("train", "dev"))
    assert task.is_chat and (task.primary_metric, task.higher_is_better) == ("chrf", True)
    template, tokenizer = ChatTemplate.from_folder(TINY), Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    end = tokenizer.id_to_token(task.eod_id)
    marked = [encode_conversation(template, tokenizer, c, end) for c in task_conversations(path)]
    blocks = task.blocks("train")
    features, targets, counts = task.block_builder("train")(np.array([*range(blocks), -1]), 64)
    assert int(targets["weights"].sum()) == sum(sum(scored) for _, scored in marked)
    scored = features["labels"][features["labels"] >= 0]  # row by row: the conversations in order
    replies = [i for ids, marks in marked for i, m in zip(ids, marks) if m]
    assert scored.tolist() == replies
    assert (features["segment_ids"][-1] == -1).all() and counts[-1].tolist() == [0, 64]  # the padding row
    assert counts[:, 0].sum() == sum(len(ids) for ids, _ in marked)
    split = task.splits["dev"].encoded
    assert split["stats"]["held_out"] == 3 and split["held_out"][2][2] == "Two, señor"


def task_conversations(path):
    from amptrain.tasks.language_model.chat import read_chat

    return read_chat(path)


def test_assistant_only_loss_false_scores_every_piece_but_the_first(tmp_path):
    task, _ = chat_task(tmp_path, assistant_only_loss=False)
    task.prepare(("train",))
    stats = task.splits["train"].encoded["stats"]
    assert stats["tokens_scored"] == stats["tokens_seen"] - stats["conversations"]


def test_text_is_not_taken_for_chat_and_the_kinds_do_not_mix(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text('{"note": "a brace first"}\nplain text\n', encoding="utf-8")
    task, path = chat_task(tmp_path)
    assert looks_like_chat(path) and not looks_like_chat(str(text))
    task.prepare(("train",))
    with pytest.raises(DataError, match=r"text\.txt: expected conversations \(JSONL\) like the other splits"):
        task.add_split("test", str(text))


@pytest.mark.parametrize(
    "metric, expected", [("exact_match", ("exact_match", True)), ("reply_loss", ("reply_loss", False))]
)
def test_the_best_checkpoints_score_is_configurable(tmp_path, metric, expected):
    task, _ = chat_task(tmp_path, best_metric=metric)
    task.prepare(("train",))
    assert (task.primary_metric, task.higher_is_better) == expected


def test_a_text_score_for_chat_data_an_unknown_one_or_chat_without_a_template_is_one_line(tmp_path):
    task, _ = chat_task(tmp_path, best_metric="bits_per_byte")
    with pytest.raises(
        ConfigError, match=r"train\.best_metric: expected one of \('chrf', 'exact_match', 'reply_loss'\)"
    ):
        task.prepare(("train",))
    with pytest.raises(ConfigError, match=r"train\.best_metric"):
        chat_task(tmp_path / "unknown", best_metric="bleu")
    task, _ = chat_task(tmp_path / "gpt2", pretrained=os.path.join(os.path.dirname(TINY), "tiny-gpt2"))
    with pytest.raises(ConfigError, match=r"tiny-gpt2: no chat template"):
        task.prepare(("train",))


def test_what_generated_replies_hold_beside_the_model_counted_by_hand(tmp_path):
    """tiny-qwen2: 2 layers of width 16, 2 query heads and 1 key-value head of 8, a feed-forward
    of 32, biases on query, key and value; float32. What `doctor --memory` adds for chat data."""
    task, _ = chat_task(tmp_path)
    task.prepare(("train",))
    model = task.build_model("float32")
    layer = 16 * 16 + 16 + 2 * (16 * 8 + 8) + 16 * 16 + 3 * 16 * 32  # q, k and v with biases, o, gate, up, down
    made = sum(
        k.numpy().nbytes + (0 if b is None else b.numpy().nbytes)
        for w in model.decoding_weights()
        for k, b in w.values()
    )
    assert made == model.decoding_bytes() == 2 * layer * 4
    assert task.evaluation_memory(model) == {
        "decoding_weights": 2 * layer * 4,
        "caches": 32 * 2 * 2 * 1 * 64 * 8 * 4,  # rows, layers, keys and values, heads, positions, head size
        "logits": 32 * model.backbone.vocabulary_size * 4 * 2,
    }
    # what the estimate measures the generation's function by: one traced and run
    traced = generation._generate.experimental_get_tracing_count()
    assert task.warm_up_evaluation(model) is True
    assert generation._generate.experimental_get_tracing_count() == traced + 1
