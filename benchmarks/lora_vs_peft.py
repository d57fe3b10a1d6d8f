"""LoRA on SmolLM2-135M-Instruct: amptrain's whole `fit` against transformers + PEFT
(`benchmarks/peers/peft_step.py`, in `.venv-hf`: `make venv-hf`) at the same shape, in one
run, both pinned to the same two cores.

    .venv/bin/python benchmarks/lora_vs_peft.py [--rounds 2] [--steps 40] [--peer-steps 15] [--shape chat]
        [--folder pretrained/SmolLM2-135M-Instruct] [--cores 0,1] [--set SECTION.KEY=VALUE]...

The shape of the speed target: the language-model task on the bundled corpus (`data/lm-kjv`),
blocks of 128, batch 8, rank 8 on query and value, `mixed_bfloat16`, XLA off, the default base
weights (float32); the peer: the same folder, rank 8 on q_proj and v_proj, bf16 autocast, 2
threads, batches of 8 × 128 from the same text. `--shape chat`: the chat config's shape
(configs/chat-smollm2-en-es.toml: blocks of 256, rank 16 on all seven projections) on the same
plain text, both sides (a step costs what it costs whichever tokens carry the loss; the peer
reads plain text only). Rounds alternate the two (peer, amptrain,
peer, amptrain, ...), so a load that comes and goes falls on both.

amptrain's tokens/s: the median of its `train` records after the first (which holds the
tracing), from `metrics.jsonl`; its peak: the whole `fit` process's maximum resident set
(loading, training, the dev score at the end), from `/usr/bin/time -v`. The peer's: what it
prints (tokens/s over its timed steps after two warm-up steps; `ru_maxrss`). Each round's
figures are printed as they come, then the medians and the ratios.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = """task = "language_model"

[data]
train = "{root}/data/lm-kjv/train.txt"
dev = "{dev}"
max_length = {length}

[model]
pretrained = "{folder}"
dropout = 0.0

[precision]
policy = "mixed_bfloat16"

[runtime]
jit_compile = false
seed = 0

[train]
steps = {steps}
batch_size = 8
learning_rate = 1e-3
decay = "constant"
weight_decay = 0.0
log_every = 10
eval_every = 100000
checkpoint_every = 100000
lora_rank = {rank}
lora_targets = "{targets}"
"""
# --shape: (positions a block, rank, amptrain's targets, the peer's)
SHAPES = {
    "target": (128, 8, "query,value", "q_proj,v_proj"),
    "chat": (256, 16, "query,key,value,output,gate,up,down", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
}


def amptrain_round(work, args, index):
    run_dir = os.path.join(work, f"run-{index}")
    command = ["taskset", "-c", args.cores, "/usr/bin/time", "-v", sys.executable, "-m", "amptrain", "fit"]
    command += [os.path.join(work, "smol.toml"), "--run-dir", run_dir]
    for override in args.overrides:
        command += ["--set", override]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        sys.exit(f"amptrain fit failed:\n{done.stderr[-3000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) / 1024
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    rates = [r["tokens_per_second"] for r in records if r["kind"] == "train"][1:]
    mfu = [r["mfu"] for r in records if r["kind"] == "train" and r.get("mfu") is not None][1:]
    return {"tokens_per_second": statistics.median(rates), "peak_mib": peak, "mfu": statistics.median(mfu or [0])}


def peer_round(args):
    python = os.path.join(ROOT, ".venv-hf", "bin", "python")
    if not os.path.exists(python):
        sys.exit("the peer runs in .venv-hf: make venv-hf")
    script = os.path.join(ROOT, "benchmarks", "peers", "peft_step.py")
    text = os.path.join(ROOT, "data", "lm-kjv", "train.txt")
    length, rank, _, targets = SHAPES[args.shape]
    command = ["taskset", "-c", args.cores, python, script, args.folder, text, "8", str(length), str(args.peer_steps)]
    done = subprocess.run(command + ["bfloat16", str(rank), targets], capture_output=True, text=True)
    found = re.search(r"([\d.]+) tokens/s.*peak RSS (\d+) MiB", done.stdout)
    if done.returncode or not found:
        sys.exit(f"the peer failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return {"tokens_per_second": float(found.group(1)), "peak_mib": float(found.group(2))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="amptrain's steps a round (a record every 10)")
    parser.add_argument("--peer-steps", type=int, default=15, help="the peer's timed steps a round")
    parser.add_argument("--folder", default=os.path.join(ROOT, "pretrained", "SmolLM2-135M-Instruct"))
    parser.add_argument("--cores", default="0,1")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default="target", help="the speed target's or the chat config's"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="an override of amptrain's run")
    args = parser.parse_args()
    if not os.path.isdir(args.folder):
        sys.exit(f"no folder {args.folder}: make pretrained-llm")
    rows = {"peft": [], "amptrain": []}
    with tempfile.TemporaryDirectory() as work:
        dev = os.path.join(work, "dev.txt")  # the first 20,000 bytes of dev: a short score at the end
        with open(os.path.join(ROOT, "data", "lm-kjv", "dev.txt"), "rb") as f, open(dev, "wb") as out:
            out.write(f.read(20000))
        with open(os.path.join(work, "smol.toml"), "w", encoding="utf-8") as f:
            length, rank, targets, _ = SHAPES[args.shape]
            config = dict(root=ROOT, dev=dev, folder=args.folder, steps=args.steps, length=length, rank=rank)
            f.write(CONFIG.format(**config, targets=targets))
        for index in range(args.rounds):
            for name in ("peft", "amptrain"):
                rows[name].append(peer_round(args) if name == "peft" else amptrain_round(work, args, index))
                with open("/proc/loadavg") as f:
                    load = f.read().split()[0]
                print(f"round {index + 1} {name:<8} {json.dumps(rows[name][-1])}  load {load}", flush=True)
    median = {name: {key: statistics.median(r[key] for r in found) for key in found[0]} for name, found in rows.items()}
    for name, figures in median.items():
        print(f"{name:<8} {figures['tokens_per_second']:6.0f} tokens/s  peak {figures['peak_mib']:,.0f} MiB")
    speed = median["amptrain"]["tokens_per_second"] / median["peft"]["tokens_per_second"]
    memory = median["amptrain"]["peak_mib"] / median["peft"]["peak_mib"]
    print(f"ratio {speed:.2f}x the tokens/s, {memory:.2f}x the peak memory")


if __name__ == "__main__":
    main()
