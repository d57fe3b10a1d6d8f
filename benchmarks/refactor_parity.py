"""Does a change move any number? Each built-in config trained a few steps, its losses, its dev
evaluations and a hash of its final weights, to compare two commits on the same machine.

    git worktree add /tmp/before COMMIT
    PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/refactor_parity.py /tmp/before.json
    .venv/bin/python benchmarks/refactor_parity.py /tmp/after.json
    .venv/bin/python benchmarks/refactor_parity.py --compare /tmp/before.json /tmp/after.json

Run from the repository's root (the configs and data are read from it; the MiniLM rows need
`make pretrained`). Every run is float32 or bf16 as named, without XLA, deterministic, 6
steps, evaluated at steps 3 and 6. The weights hash is SHA-256 over the latest checkpoint's
tensors by name (optimizer slots left out), so it does not depend on the variables' order.
A row name or more after OUT trains only those rows.
"""

import argparse
import glob
import hashlib
import json
import os
import sys
import tempfile

COMMON = [
    "train.steps=6",
    "train.log_every=1",
    "train.eval_every=3",
    "train.checkpoint_every=6",
    "runtime.jit_compile=false",
    "runtime.deterministic=true",
    "train.projector_rows=0",
]
LM = ["train.batch_size=4", "data.max_length=64", "generate.max_new_tokens=8"]
ROWS = {
    "classify": ("configs/classify-spam.toml", ["precision.policy=float32", "train.batch_size=16"]),
    "classify-bf16": ("configs/classify-spam.toml", ["precision.policy=mixed_bfloat16", "train.batch_size=16"]),
    "ner": ("configs/ner-wnut17.toml", ["precision.policy=float32", "train.batch_size=16"]),
    "translate": (
        "configs/translate-en-es.toml",
        ["precision.policy=float32", "train.batch_size=16", "decode.dev_sentences=4"],
    ),
    "lm": ("configs/lm-kjv.toml", ["precision.policy=float32", *LM]),
    "lm-bf16": ("configs/lm-kjv.toml", ["precision.policy=mixed_bfloat16", *LM]),
    "lora-llama": ("tests/pretrained/tiny-llama3", []),
    "lora-gpt2": ("tests/pretrained/tiny-gpt2", []),
    "classify-minilm": ("configs/classify-spam-minilm.toml", ["precision.policy=float32", "train.batch_size=8"]),
    "ner-minilm": ("configs/ner-wnut17-minilm.toml", ["precision.policy=float32", "train.batch_size=8"]),
}
LORA = """task = "language_model"
[data]
train = "{data}/train.txt"
dev = "{data}/dev.txt"
test = "{data}/dev.txt"
max_length = 64
[model]
pretrained = "{folder}"
dropout = 0.0
[generate]
max_new_tokens = 8
[precision]
policy = "float32"
[train]
batch_size = 4
lora_rank = 4
"""


def weights_hash(run_dir):
    """(SHA-256 of the latest checkpoint's tensors by name, optimizer slots aside; their count)."""
    import numpy as np
    import tensorflow as tf

    index = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.index")))[-1]
    reader = tf.train.load_checkpoint(index[: -len(".index")])
    names = sorted(n for n in reader.get_variable_to_shape_map() if "optimizer" not in n.lower())
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(reader.get_tensor(name)).tobytes())
    return digest.hexdigest(), len(names)


def train_row(name, scratch):
    from amptrain import api
    from amptrain.engine.run_log import read_metrics

    config, extra = ROWS[name]
    if config.startswith("tests/pretrained/"):  # a LoRA fit of a tiny causal checkpoint
        path = os.path.join(scratch, f"{name}.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(LORA.format(data=os.path.abspath("data/lm-kjv"), folder=os.path.abspath(config)))
        config = path
    run_dir = os.path.join(scratch, name)
    api.fit(config, COMMON + extra, run_dir=run_dir, overwrite=True)
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    timing = ("second", "time", "per_s", "mfu")
    evals = [
        {k: v for k, v in r.items() if isinstance(v, float) and not any(t in k for t in timing)}
        for r in records
        if r.get("kind") == "eval"
    ]
    losses = [r["loss"] for r in records if r.get("kind") == "train"]
    return {"losses": losses, "evals": evals, "weights": weights_hash(run_dir)}


def compare(before, after):
    """One line a row: the largest loss and evaluation differences, and whether the weights match."""
    lines = []
    for name, a in before.items():
        b = after.get(name)
        if b is None:
            lines.append(f"{name:16} missing")
            continue
        loss = max((abs(x - y) for x, y in zip(a["losses"], b["losses"])), default=0.0)
        pairs = [(x[k], y[k]) for x, y in zip(a["evals"], b["evals"]) for k in x if k in y]
        evaluation = max((abs(x - y) for x, y in pairs), default=0.0)
        steps = f"{len(a['losses'])}/{len(b['losses'])}"
        same = "same" if a["weights"] == b["weights"] else "DIFFER"
        lines.append(f"{name:16} steps {steps}  max|dloss| {loss:.2e}  max|deval| {evaluation:.2e}  weights {same}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where the rows' numbers go (JSON)")
    parser.add_argument("rows", nargs="*", help=f"of {', '.join(ROWS)} (default: all)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        with open(args.compare[0]) as a, open(args.compare[1]) as b:
            print("\n".join(compare(json.load(a), json.load(b))))
        return 0
    if not args.out:
        parser.error("OUT or --compare BEFORE AFTER")
    results = {}
    with tempfile.TemporaryDirectory(prefix="amptrain-parity-") as scratch:
        for name in args.rows or ROWS:
            if "minilm" in name and not os.path.isdir("pretrained/all-MiniLM-L6-v2"):
                print(f"{name}: skipped (make pretrained)", file=sys.stderr)
                continue
            results[name] = train_row(name, scratch)
            print(name, results[name]["losses"], results[name]["weights"][0][:16], flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
