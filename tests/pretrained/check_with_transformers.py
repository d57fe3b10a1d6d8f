"""Run in the `transformers` environment (`make venv-hf`: CPU torch, transformers, gguf; never
amptrain's): what `transformers` makes of a folder amptrain exported.

    .venv-hf/bin/python tests/pretrained/check_with_transformers.py FOLDER REQUEST.json
    .venv-hf/bin/python tests/pretrained/check_with_transformers.py FILE.gguf REQUEST.json   # gguf_file=

REQUEST holds {"texts": [...], "max_new_tokens": N}, and may hold "chats": [[{"role", "content"}]].
Printed, one JSON object: for each text `transformers`' ids (AutoTokenizer, its special
tokens), the float32 logits of every position (the model upcast to float32 whatever dtype it
was saved in; a GGUF file dequantized to float32), and the greedy continuation of
`generate(do_sample=False)` decoded without special tokens; for each chat, the ids of its
messages through the tokenizer's chat template with the generation prompt, and the greedy
reply; and the warnings `from_pretrained` logged (missing or unexpected keys among them).
"""

import json
import logging
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging


def main(folder, request_path):
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    hf_logging.get_logger().addHandler(Keep())
    where = {"gguf_file": os.path.basename(folder)} if folder.endswith(".gguf") else {}
    folder = os.path.dirname(folder) if where else folder
    tokenizer = AutoTokenizer.from_pretrained(folder, **where)
    if where:  # GGUF: dequantized into float32 as it loads (a model so loaded refuses .float())
        model, saved_dtype = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **where), "gguf"
    else:
        model = AutoModelForCausalLM.from_pretrained(folder)
        saved_dtype = str(model.dtype).replace("torch.", "")
        model = model.float()
    model = model.eval()
    torch.manual_seed(0)
    records = []
    for text in request["texts"]:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(ids).logits[0]
            out = model.generate(
                ids, max_new_tokens=request["max_new_tokens"], do_sample=False, pad_token_id=tokenizer.eos_token_id
            )
        records.append(
            {
                "ids": ids[0].tolist(),
                "logits": logits.tolist(),
                "generated": tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True),
            }
        )
    replies = []
    for messages in request.get("chats", []):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = ids["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=request["max_new_tokens"], do_sample=False, pad_token_id=tokenizer.eos_token_id
            )
        replies.append(
            {"ids": ids[0].tolist(), "reply": tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)}
        )
    print(json.dumps({"dtype": saved_dtype, "warnings": warnings, "records": records, "replies": replies}))


if __name__ == "__main__":
    main(*sys.argv[1:])
