"""Gives the tiny Llama 3, Qwen2 and Gemma folders their families' real chat templates (as the
instruct models publish them) and stores what `transformers`' `apply_chat_template` makes of a
few conversations with them, the reference of tasks/language_model/chat.py; run in its own
environment (make_reference.py says how), never an amptrain dependency:

    /tmp/hf/bin/python tests/pretrained/make_chat_templates.py

It writes tests/pretrained/tiny-<family>/chat_template.jinja and reference-chat-templates.json:
for each family and conversation, the ids (whole, and up to the last reply with the generation
prompt) and how many pieces the replies and their end token make tokenized alone. The tiny
vocabularies do not hold these templates' special tokens, so they are tokenized as text: the
comparison is of rendering and tokenization, which is what the reference is for.
"""

import json
import os

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = {  # the instruct models' own (Meta-Llama-3-8B-Instruct, Qwen2-0.5B-Instruct, gemma-2b-it)
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
        "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
        "{{ content }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
        "<|eot_id|>",
    ),
    "qwen2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        "<|im_end|>",
    ),
    "gemma": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
        "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
        "<end_of_turn>",
    ),
}
CONVERSATIONS = [
    [
        {"role": "user", "content": "Translate into Spanish: In the beginning God created the heaven and the earth."},
        {"role": "assistant", "content": "En el principio creó Dios los cielos y la tierra."},
    ],
    [
        {"role": "system", "content": "You translate verse, nothing else."},
        {"role": "user", "content": "And God said, Let there be light: and there was light."},
        {"role": "assistant", "content": "  Y dijo Dios: Sea la luz; y fue la luz.  "},
        {"role": "user", "content": "The 2nd verse? ¿Y el versículo 2? ✓"},
        {"role": "assistant", "content": "Y la tierra estaba desordenada y vacía — 2."},
    ],
]


def main():
    references = {}
    for family, (template, end) in TEMPLATES.items():
        folder = os.path.join(HERE, f"tiny-{family}")
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        records = []
        for conversation in CONVERSATIONS:
            if family == "gemma" and conversation[0]["role"] == "system":  # its template refuses one
                conversation = conversation[1:]
            trims = "| trim" in template  # Llama 3's and Gemma's strip a message's content, Qwen2's does not
            replies = [
                (m["content"].strip() if trims else m["content"]) + end
                for m in conversation
                if m["role"] == "assistant"
            ]
            records.append(
                {
                    "messages": conversation,
                    "end_token": end,
                    "ids": tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"],
                    "prompt_ids": tokenizer.apply_chat_template(
                        conversation[:-1], tokenize=True, add_generation_prompt=True, return_dict=True
                    )["input_ids"],
                    "reply_pieces": sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies),
                }
            )
        references[family] = records
        print(f"{family}: {[len(r['ids']) for r in records]} pieces")
    with open(os.path.join(HERE, "reference-chat-templates.json"), "w", encoding="utf-8") as f:
        json.dump(references, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
