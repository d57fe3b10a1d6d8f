"""data/chat-en-es/: conversations for chat fine-tuning, made from the bundled English–Spanish
verse pairs (data/translate-en-es/, King James Bible and Reina-Valera 1909, public domain).

    python scripts/make_chat_en_es.py

Each pair becomes one JSONL line in the format OpenAI, TRL and torchtune read:
{"messages": [{"role": "user", "content": "Translate into Spanish: <verse>"},
              {"role": "assistant", "content": "<its Spanish verse>"}]}
The first pairs of the translation splits (already shuffled, with a seed, when they were
made) give train, dev and test, SIZES of each; a dev or test pair whose English is also a
training prompt (the Bible repeats some verses word for word) is passed over, so no prompt
is in two splits. Rerunning writes the same files.
"""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "data", "translate-en-es")
DEST = os.path.join(ROOT, "data", "chat-en-es")
SIZES = {"train": 4000, "dev": 100, "test": 200}
INSTRUCTION = "Translate into Spanish: "


def main():
    os.makedirs(DEST, exist_ok=True)
    seen = set()  # the English of the splits written so far
    for split, size in SIZES.items():
        with open(os.path.join(SOURCE, f"{split}.tsv"), encoding="utf-8") as f:
            pairs = [line.rstrip("\n").split("\t") for line in f]
        pairs = [p for p in pairs if p[0] not in seen][:size]
        seen |= {english for english, _ in pairs}
        with open(os.path.join(DEST, f"{split}.jsonl"), "w", encoding="utf-8") as out:
            for english, spanish in pairs:
                messages = [
                    {"role": "user", "content": INSTRUCTION + english},
                    {"role": "assistant", "content": spanish},
                ]
                out.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
        print(f"{DEST}/{split}.jsonl: {len(pairs)} conversations")


if __name__ == "__main__":
    main()
