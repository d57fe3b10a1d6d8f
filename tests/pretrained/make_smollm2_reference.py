"""What `transformers` makes of SmolLM2-135M-Instruct's GGUF file, the reference amptrain's own
GGUF reader (amptrain/gguf_files/) is held to; run in its own environment (never an amptrain
dependency), after `make pretrained-llm`:

    python3.11 -m venv /tmp/hf && /tmp/hf/bin/pip install torch==2.13.0 transformers accelerate gguf safetensors
    /tmp/hf/bin/python tests/pretrained/make_smollm2_reference.py

`from_pretrained(pretrained/, gguf_file=...)` dequantizes the file with the `gguf` package and
undoes llama.cpp's row order itself. For each of TEXTS, reference-smollm2.json holds the ids
of the folder amptrain wrote (its tokenizer.json, loaded by `transformers`), the float32 logits
of every position for the first COLUMNS pieces, the last position's 64 largest logits with
their ids, and the greedy continuation of 20 new pieces (`generate`, special pieces skipped);
for each of CONVERSATIONS, `apply_chat_template`'s ids (whole, and up to the last reply with
the generation prompt) and how many pieces its replies and their end tokens make alone.
It also prints how far `transformers` running amptrain's folder is from its own GGUF loading.
"""

import json
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
PRETRAINED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "pretrained")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = os.path.join(PRETRAINED, "SmolLM2-135M-Instruct")
TEXTS = [
    "The capital of France is",
    "In the beginning God created the heaven and the earth. And the earth was",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Translate into Spanish: Good morning, 12 friends! ¿Qué tal? — ünïcödé ✓",
]
COLUMNS = 32
CONVERSATIONS = [
    [
        {"role": "user", "content": "Translate into Spanish: In the beginning God created the heaven and the earth."},
        {"role": "assistant", "content": "En el principio creó Dios los cielos y la tierra."},
    ],
    [
        {"role": "system", "content": "You translate English verse into Spanish, nothing else."},
        {"role": "user", "content": "Translate into Spanish: And God said, Let there be light: and there was light."},
        {"role": "assistant", "content": "Y dijo Dios: Sea la luz; y fue la luz."},
        {"role": "user", "content": "And the 2nd verse? ¿Y el versículo 2? ✓"},
        {"role": "assistant", "content": "Y la tierra estaba desordenada y vacía — 2."},
    ],
]


def main():
    torch.manual_seed(0)
    from_gguf = AutoModelForCausalLM.from_pretrained(PRETRAINED, gguf_file=GGUF, dtype=torch.float32).eval()
    from_folder = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    gguf_tokenizer = AutoTokenizer.from_pretrained(PRETRAINED, gguf_file=GGUF)
    records, worst = [], 0.0
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            logits = from_gguf(torch.tensor([ids])).logits[0]
            folder_logits = from_folder(torch.tensor([ids])).logits[0]
            generated = from_gguf.generate(
                torch.tensor([ids]), max_new_tokens=20, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )[0, len(ids) :].tolist()
        worst = max(worst, float((logits - folder_logits).abs().max()))
        top = torch.topk(logits[-1], 64)
        records.append(
            {
                "text": text,
                "ids": ids,
                "gguf_tokenizer_ids": gguf_tokenizer(text)["input_ids"],
                "logits_first_columns": logits[:, :COLUMNS].tolist(),
                "last_top_ids": top.indices.tolist(),
                "last_top_logits": top.values.tolist(),
                "generated_ids": generated,
                "generated": tokenizer.decode(generated, skip_special_tokens=True),
            }
        )
    chats = []
    for conversation in CONVERSATIONS:
        replies = [m["content"] + tokenizer.eos_token for m in conversation if m["role"] == "assistant"]
        chats.append(
            {
                "messages": conversation,
                "ids": tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"],
                "prompt_ids": tokenizer.apply_chat_template(
                    conversation[:-1], tokenize=True, add_generation_prompt=True, return_dict=True
                )["input_ids"],
                "reply_pieces": sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies),
            }
        )
    with open(os.path.join(HERE, "reference-smollm2.json"), "w", encoding="utf-8") as f:
        json.dump({"gguf": GGUF, "texts": records, "chats": chats}, f, ensure_ascii=False)
    print(f"transformers on amptrain's folder against its own GGUF loading: max |logit difference| {worst:.2e}")
    for record in records:
        same = record["ids"] == record["gguf_tokenizer_ids"]
        print(f"{record['text'][:40]!r}: ids {'equal' if same else 'DIFFER'} to transformers' GGUF tokenizer")


if __name__ == "__main__":
    main()
