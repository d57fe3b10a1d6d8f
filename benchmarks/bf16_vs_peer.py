"""amptrain's best float32 and best bf16 training step against PyTorch + Hugging Face
BertForSequenceClassification at the same shape, side by side in one run.

    .venv/bin/python benchmarks/bf16_vs_peer.py [--rounds 7] [--steps 8] [--dropout 0.0]
        [--peer-venv /tmp/amptrain-peer]
        [--amptrain float32,float32+xla,mixed_bfloat16,mixed_bfloat16+xla,mixed_bfloat16+fusible]

Shape (the seed shape of the bf16 issue): 4 layers, hidden 256, 4 heads, FFN 1024,
sequence 128, batch 32, vocabulary 8000, one synthetic batch served from memory, train
mode, AdamW, the same dropout on both sides.

Two long-lived worker processes, each built and warmed up once: amptrain (this venv;
every variant's Trainer in one process, `steps` steps a graph call, the engine's path)
and the peer (a venv of its own with torch and transformers, made on first use with
`pip install torch==2.13.0 transformers`; never this project's venv). The coordinator
then asks them for one timed call at a time, every variant in turn, round after round
(A, B, C, ..., A, B, C, ...), so a load that comes and goes on a shared machine falls on
all variants alike; it prints each round with /proc/loadavg, the medians, and last
`ratio R`: amptrain's best median over the peer's best median.

Tokens/s count batch x sequence positions on both sides (amptrain's padded tokens; the
peer's batch has no padding).

Variants: amptrain POLICY[+xla|+fusible] (`runtime.jit_compile` true or "fusible"); peer float32 and bf16
(`torch.autocast("cpu", dtype=torch.bfloat16)`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "length": 128, "batch": 32, "vocab": 8000}
PEER_PACKAGES = ["torch==2.13.0", "transformers"]


# === Workers: read a variant name a line, answer one JSON line ===


def serve(build, steps):
    """`build(names) -> {name: run}`, `run(steps)` runs `steps` training steps and returns
    the real tokens they trained on (the work is finished when it returns)."""
    runs = build(sys.stdin.readline().split())
    print(json.dumps({"ready": sorted(runs)}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        started = time.perf_counter()
        tokens = runs[name](steps)
        seconds = time.perf_counter() - started
        print(json.dumps({"variant": name, "tokens_per_second": tokens / seconds}), flush=True)


def variant(name):
    """(policy, `runtime.jit_compile`) of an amptrain variant named POLICY[+xla|+fusible]."""
    policy, *flags = name.split("+")
    return policy, "fusible" if "fusible" in flags else "xla" in flags


def build_amptrain(names, dropout, steps, extra=()):
    sys.path.insert(0, os.path.join(ROOT, "src"))
    os.chdir(ROOT)
    from amptrain import config as config_lib
    from amptrain.bench.building import build_trainer
    from amptrain.bench.worker import one_batch_repeated
    from amptrain.distribute import distribute_batches

    seed = [
        ("model.num_layers", SHAPE["layers"]),
        ("model.hidden_dim", SHAPE["hidden"]),
        ("model.num_heads", SHAPE["heads"]),
        ("model.intermediate_dim", SHAPE["ffn"]),
        ("data.max_length", SHAPE["length"]),
        ("data.vocabulary_size", SHAPE["vocab"]),
        ("train.batch_size", SHAPE["batch"]),
        ("model.dropout", dropout),
        ("runtime.steps_per_execution", steps),
    ]
    runs = {}
    for name in names:
        policy, jit = variant(name)
        settings = [("precision.policy", policy), ("runtime.jit_compile", jit), *extra]
        config = config_lib.load_config(os.path.join(ROOT, "configs/classify-spam.toml"), seed + settings)
        task, _, trainer, _ = build_trainer(config)
        # The longest of the first real batches, served from memory (`--data synthetic`).
        batches = one_batch_repeated(task.train_dataset(0))
        iterator = iter(distribute_batches(trainer.strategy, lambda batches=batches: batches))
        for _ in range(8):  # trace, compile, warm up: after 2 calls its speed still rose round by round
            trainer.train(iterator, steps)

        # Padded tokens (batch x 128 here): the peer's batch is all real tokens, so both
        # sides count the positions they compute on.
        def run(n, trainer=trainer, iterator=iterator):
            return int(trainer.train(iterator, n)["tokens"][1])

        runs[name] = run
    return runs


def build_peer(names, dropout, steps):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    config = BertConfig(
        vocab_size=SHAPE["vocab"],
        hidden_size=SHAPE["hidden"],
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=SHAPE["heads"],
        intermediate_size=SHAPE["ffn"],
        max_position_embeddings=SHAPE["length"],
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=2,
    )
    batch, length = SHAPE["batch"], SHAPE["length"]
    ids = torch.randint(1, SHAPE["vocab"], (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    labels = torch.randint(0, 2, (batch,))
    runs = {}
    for name in names:
        model = BertForSequenceClassification(config).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        bf16 = name == "bf16"

        runs[name] = peer_run(model, optimizer, ids, mask, labels, bf16, steps)
    return runs


def peer_run(model, optimizer, ids, mask, labels, bf16, steps):
    """`run(n)`: n training steps of the peer's `model` on one batch (bf16: under
    `torch.autocast`), returning the tokens trained on; warmed up with 2 x `steps` steps
    (oneDNN primitive caches, allocator). finetune_vs_hf.py's peer runs this too."""
    import torch

    def run(n):
        for _ in range(n):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return n * ids.numel()

    run(2 * steps)
    return run


# === Coordinator ===


def peer_python(venv):
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"making the peer venv {venv}: pip install {' '.join(PEER_PACKAGES)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return python


class Worker:
    """A long-lived worker process of `script` (this file unless named) serving `kind`."""

    def __init__(self, python, kind, names, args, script=__file__, extra=None):
        command = [python, os.path.abspath(script), "--serve", kind, "--steps", str(args.steps)]
        command += ["--dropout", str(args.dropout)] if extra is None else extra
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.path.join(ROOT, "src")}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        self.ask(" ".join(names))

    def ask(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        while True:
            answer = self.process.stdout.readline()
            if not answer:
                raise RuntimeError(f"worker ended (exit {self.process.wait()})")
            if answer.startswith("{"):
                return json.loads(answer)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8, help="training steps a timed call (default 8)")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--peer-venv", default="/tmp/amptrain-peer")
    parser.add_argument(
        "--amptrain", default="float32,float32+xla,mixed_bfloat16,mixed_bfloat16+xla,mixed_bfloat16+fusible"
    )
    parser.add_argument("--peer", default="float32,bf16")
    parser.add_argument("--serve", choices=("amptrain", "peer"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        build = build_amptrain if args.serve == "amptrain" else build_peer
        serve(lambda names: build(names, args.dropout, args.steps), args.steps)
        return

    ours, theirs = args.amptrain.split(","), args.peer.split(",")
    print(f"shape {SHAPE}, dropout {args.dropout}, {args.steps} steps a call, {args.rounds} rounds", flush=True)
    print(f"load at start {loadavg()}; cpus {os.cpu_count()}", flush=True)
    workers = {
        "amptrain": Worker(sys.executable, "amptrain", ours, args),
        "peer": Worker(peer_python(args.peer_venv), "peer", theirs, args),
    }
    order = [("amptrain", name) for name in ours] + [("peer", name) for name in theirs]
    figures = {key: [] for key in order}
    for index in range(args.rounds):
        load = loadavg()
        for key in order if index % 2 == 0 else order[::-1]:  # alternate the order too
            figures[key].append(workers[key[0]].ask(key[1])["tokens_per_second"])
        print(f"round {index + 1} load {load}: " + ", ".join(f"{k[0]} {k[1]} {v[-1]:,.0f}" for k, v in figures.items()))
    for worker in workers.values():
        worker.close()
    medians = {key: statistics.median(values) for key, values in figures.items()}
    print(f"medians (tokens/s), load at end {loadavg()}:")
    for (side, name), value in medians.items():
        print(f"  {side:9s} {name:24s} {value:10,.0f}")
    best = {side: max((v, n) for (s, n), v in medians.items() if s == side) for side in ("amptrain", "peer")}
    f32 = [v for (s, n), v in medians.items() if s == "amptrain" and variant(n)[0] == "float32"]
    bf16 = [v for (s, n), v in medians.items() if s == "amptrain" and variant(n)[0] == "mixed_bfloat16"]
    if f32 and bf16:
        print(f"amptrain best bf16 / best float32: {max(bf16) / max(f32):.2f}")
    print(
        f"amptrain best: {best['amptrain'][1]} {best['amptrain'][0]:,.0f}; peer best: {best['peer'][1]} "
        f"{best['peer'][0]:,.0f}"
    )
    print(f"ratio {best['amptrain'][0] / best['peer'][0]:.2f}")


if __name__ == "__main__":
    main()
