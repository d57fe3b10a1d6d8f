"""Chat data in the language-model task: conversations (`chat.py` reads, renders and masks
them) packed into the task's blocks, the loss on the replies alone, and the last reply of
each held-out conversation generated and scored.

    [data] train = "data/chat-en-es/train.jsonl"   # JSONL conversations: the format is told from the content
    [train] assistant_only_loss = true             # false: every piece of a conversation is scored
            eval_generate_examples = 50            # dev conversations generated between steps (0: all)
            best_metric = "chrf"                   # or exact_match, reply_loss

A split is its conversations rendered with the pretrained folder's chat template, packed in
order into blocks of `data.max_length` (`chat.pack`: segments and positions restart at each
conversation, a conversation longer than a block cut at a turn boundary or dropped, and
counted), and, for scoring, each conversation that ends with a reply: the prompt up to it
(with the generation prompt) and the reply as written. A split is scored by `reply_loss`
(the mean loss a scored piece), and by the replies generated greedily (KV cache, to the end
piece or `generate.max_new_tokens`) against the written ones: sacrebleu's corpus chrF (0-100)
and `exact_match` (the share equal after trimming spaces).
"""

import dataclasses
import json
import logging

import numpy as np

from amptrain.config import require
from amptrain.errors import ConfigError, DataError
from amptrain.tasks.base import Split
from amptrain.tasks.language_model import chat, generation
from amptrain.tasks.language_model.lora import LoraTrainConfig

logger = logging.getLogger("amptrain")
HIGHER_IS_BETTER = {"chrf": True, "exact_match": True, "reply_loss": False}  # a chat split's scores
GENERATE_ROWS = 32  # replies generated at once


@dataclasses.dataclass(frozen=True)
class LanguageModelTrain(LoraTrainConfig):
    """`[train]` of the language model: LoRA's keys, and the chat data's."""

    assistant_only_loss: bool = True  # chat data: the loss on the replies alone; false: on every piece
    eval_generate_examples: int = 0  # chat data: dev conversations generated between steps (0: all)
    # the dev score that picks the best checkpoint: "" is bits_per_byte (text), chrf (chat);
    # chat: chrf, exact_match or reply_loss
    best_metric: str = ""


def check(config):
    t = config.train
    n = t.eval_generate_examples
    require(isinstance(n, int) and n >= 0, "train.eval_generate_examples", "an integer >= 0 (0: all)", n)
    known = ("", *HIGHER_IS_BETTER, "bits_per_byte", "loss", "perplexity")
    require(t.best_metric in known, "train.best_metric", f"one of {known[1:]}", t.best_metric)


def best_metric(config, is_chat):
    """(the dev score that picks the best checkpoint, whether higher is better)."""
    chosen = config.train.best_metric or ("chrf" if is_chat else "bits_per_byte")
    if (chosen in HIGHER_IS_BETTER) != is_chat:
        kind = "chat" if is_chat else "text"
        which = tuple(HIGHER_IS_BETTER) if is_chat else ("bits_per_byte", "loss", "perplexity")
        raise ConfigError(f"train.best_metric: expected one of {which} for {kind} data, received {chosen!r}")
    return chosen, HIGHER_IS_BETTER.get(chosen, False)


def looks_like_chat(path):
    """Whether the file's first non-blank line is a conversation: a JSON object with
    `messages`, or `prompt` and `completion`."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            line = next((line for line in f if line.strip()), "")
        record = json.loads(line)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and ("messages" in record or {"prompt", "completion"} <= set(record))


def chat_split(task, name, files):
    """The split `name` of conversation files: its packed blocks and held-out replies."""
    if task.checkpoint is None:
        raise ConfigError(f"{files[0]}: chat data needs a model with a chat template; set model.pretrained")
    template = chat.ChatTemplate.from_folder(task.checkpoint.path)
    end = task.tokenizer.piece(task.eod_id)
    only_replies = task.config.train.assistant_only_loss
    conversations = [c for path in files for c in chat.read_chat(path)]
    encoded = [
        chat.encode_conversation(template, task.tokenizer.library, c, end, score_all=not only_replies)
        for c in conversations
    ]
    blocks, stats = chat.pack(encoded, task.config.data.max_length)
    if not len(blocks["token_ids"]):
        raise DataError(f"{files[0]}: no conversation fits a block of data.max_length = {task.config.data.max_length}")
    held_out = _held_out(template, task.tokenizer, conversations)
    stats["held_out"] = len(held_out)
    logger.info(
        f"{name}: {stats['conversations']:,} conversations in {len(blocks['token_ids'])} blocks of "
        f"{task.config.data.max_length}: {stats['tokens_scored']:,} of {stats['tokens_seen']:,} pieces scored, "
        f"{stats['padding']:,} padding" + (f", {stats['cut']} cut at a turn" if stats["cut"] else "")
        + (f", {stats['dropped']} dropped (a first reply past a block)" if stats["dropped"] else "")
    )  # fmt: skip
    encoded = {"blocks": blocks, "stats": stats, "held_out": held_out, "tokens_total": stats["tokens_seen"]}
    return Split(name, files[0], files, encoded, np.zeros(0, np.int32))


def _held_out(template, tokenizer, conversations):
    """[(prompt ids, messages before the reply, the reply)] of each conversation ending with a reply."""
    kept = [c for c in conversations if c[-1]["role"] == "assistant"]
    prompts = [template.render(c[:-1], add_generation_prompt=True) for c in kept]
    ids = tokenizer.encode(prompts) if prompts else []
    return [(i, c[:-1], c[-1]["content"]) for i, c in zip(ids, kept)]


def block_builder(blocks):
    """(block indices, length) -> a batch of packed blocks: (features, targets, token counts);
    index -1 is a padding row. A position is scored where its label (the next piece) is >= 0."""
    empty = {"token_ids": 0, "labels": -1, "segment_ids": -1, "positions": 0}

    def build(indices, length):
        indices = np.asarray(indices)
        real_rows = indices >= 0
        features = {}
        for key, fill in empty.items():
            rows = blocks[key][np.maximum(indices, 0), :length]
            features[key] = np.where(real_rows[:, None], rows, fill).astype(np.int32)
        weights = (features["labels"] >= 0).astype(np.float32)
        seen = (features["segment_ids"] >= 0).sum(axis=1).astype(np.int32)
        counts = np.stack([seen, np.full(len(indices), length, np.int32)], axis=1)
        return features, {"labels": np.maximum(features["labels"], 0), "weights": weights}, counts

    return build


def evaluate(task, split_name, model, nats_and_count, predictions_path=None, quick=False):
    """{"reply_loss", "chrf", "exact_match", "tokens", "replies"} of the split; `quick` (dev
    between steps) generates the first `train.eval_generate_examples` replies only."""
    import sacrebleu

    nats, count = nats_and_count
    held_out = task.splits[split_name].encoded["held_out"]
    limit = task.config.train.eval_generate_examples
    if quick and limit:
        held_out = held_out[:limit]
    generated = generate_replies(task, model, [ids for ids, _, _ in held_out])
    references = [reply for _, _, reply in held_out]
    metrics = {
        "reply_loss": nats / max(count, 1),
        "chrf": float(sacrebleu.corpus_chrf(generated, [references]).score) if held_out else 0.0,
        "exact_match": float(np.mean([g.strip() == r.strip() for g, r in zip(generated, references)]))
        if held_out
        else 0.0,
        "tokens": int(count),
        "replies": len(held_out),
    }
    if predictions_path:
        with open(predictions_path + task.predictions_suffix, "w", encoding="utf-8") as f:
            for (_, messages, reply), made in zip(held_out, generated):
                f.write(
                    json.dumps({"messages": messages, "reference": reply, "reply": made}, ensure_ascii=False) + "\n"
                )
    return metrics


def generate_replies(task, model, prompts, settings=None):
    """The reply to each prompt (piece ids ending with the generation prompt), to the end
    piece or `generate.max_new_tokens`, GENERATE_ROWS at a time, shortest prompts together
    (a batch's prompts are written into the caches at once up to its shortest: `generation`);
    greedy unless `settings`."""
    settings = settings or dataclasses.replace(task.config.generate, temperature=0.0)
    length = task.config.data.max_length
    room = length - settings.max_new_tokens
    prompts = [ids[-room:] for ids in prompts]  # a long prompt: its end
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    replies = [""] * len(prompts)
    weights = model.decoding_weights()  # once, not a batch: a quantized base's are read off its calls
    for first in range(0, len(prompts), GENERATE_ROWS):
        rows = order[first : first + GENERATE_ROWS]
        padded, lengths = generation.padded_prompts([prompts[i] for i in rows])
        out = generation.generate(model, padded, lengths, task.eod_id, settings, weights).numpy()
        for i, r, n in zip(rows, out, lengths):
            replies[i] = task.tokenizer.decode(generation.continuation(r, n, task.eod_id))
    return replies


def warm_up(task, model):
    """A reply of 2 pieces to a 1-piece prompt: the generation's function traced and made, as
    scoring replies makes it (what `doctor --memory` measures it by). Returns True."""
    settings = dataclasses.replace(task.config.generate, temperature=0.0, max_new_tokens=2)
    generate_replies(task, model, [[task.eod_id]], settings)
    return True


def generation_memory(task, model):
    """{part: bytes} that scoring generated replies holds beside the model (`generate_replies`:
    GENERATE_ROWS rows, their caches as long as the context at most): the decoding weights,
    the caches, a step's float32 logits and what picks from them."""
    import tensorflow as tf

    one_row = model.empty_caches(1, task.config.data.max_length)
    cache = sum(tensor.shape.num_elements() * tensor.dtype.size for tensor in tf.nest.flatten(one_row))
    vocabulary = getattr(model, "vocabulary_size", None) or model.backbone.vocabulary_size
    return {
        "decoding_weights": int(model.decoding_bytes()),
        "caches": GENERATE_ROWS * cache,
        "logits": GENERATE_ROWS * vocabulary * 4 * 2,
    }


def replies(task, model, user_texts, system=None):
    """`predict --chat`: each text as a user's message (after `system`'s, if given), the
    model's reply generated as `[generate]` says, to the end token; records {"messages",
    "reply"}. `task`: a language-model task on a pretrained folder with a chat template."""
    if task.checkpoint is None:
        raise ConfigError(f"{task.run_dir}: --chat needs a model with a chat template (model.pretrained)")
    template = chat.ChatTemplate.from_folder(task.checkpoint.path)
    settings, length = task.config.generate, task.config.data.max_length
    generation.check(settings, length)  # max_new_tokens within the context, as `predict` checks it
    conversations = [([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": t}]
                     for t in user_texts]  # fmt: skip
    encoded = [task.tokenizer.encode([template.render(c, add_generation_prompt=True)])[0] for c in conversations]
    room = length - settings.max_new_tokens
    for text, ids in zip(user_texts, encoded):
        if len(ids) > room:
            raise DataError(
                f"--chat {text[:40]!r}: {len(ids)} pieces with the template, more than the {room} the model's "
                f"{length} positions leave beside generate.max_new_tokens ({settings.max_new_tokens})"
            )
    made = generate_replies(task, model, encoded, settings)
    return [{"messages": c, "reply": reply} for c, reply in zip(conversations, made)]
