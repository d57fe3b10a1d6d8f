"""Fine-tuning all-MiniLM-L6-v2 on the spam data: amptrain (its policies, with and without
XLA: POLICY[+xla|+fusible], `runtime.jit_compile` true or "fusible") against Hugging Face
`transformers` on PyTorch's CPU build, side by side in one run.

    make pretrained
    .venv/bin/python benchmarks/finetune_vs_hf.py [--rounds 5] [--steps 4] [--peer-venv /tmp/amptrain-peer]
        [--amptrain float32,mixed_bfloat16,mixed_bfloat16+fusible] [--peer float32,bf16]

Both sides train the same checkpoint (pretrained/all-MiniLM-L6-v2) as a 2-class sequence
classifier, in train mode (its dropout 0.1), AdamW, batch 32 at sequence 128:
- amptrain: `configs/classify-spam-minilm.toml` as `amptrain fit` builds it (masked-mean
  pooling, the recipe's per-layer learning rates), on the longest of its first real
  batches (32 x 128: most spam mails fill 128 pieces), served from memory;
- the peer: `AutoModelForSequenceClassification` (BERT's pooled [CLS] head) on 32 x 128
  random piece ids, with `torch.autocast("cpu", dtype=torch.bfloat16)` for bf16; a venv of
  its own (`pip install torch==2.13.0 transformers`, made on first use), never amptrain's.

Tokens/s count batch x 128 positions on both sides. The two workers are built and warmed
up once; then each variant runs one timed call of `--steps` steps in turn, round after
round (bf16_vs_peer.py's coordinator), and the last line is `ratio R`: amptrain's best
median over the peer's best median.
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bf16_vs_peer import Worker, loadavg, peer_python, peer_run, serve, variant  # noqa: E402

ROOT = os.path.dirname(HERE)
CHECKPOINT = os.path.join(ROOT, "pretrained", "all-MiniLM-L6-v2")
CONFIG = os.path.join(ROOT, "configs", "classify-spam-minilm.toml")
BATCH, LENGTH = 32, 128


def build_amptrain(names, steps):
    sys.path.insert(0, os.path.join(ROOT, "src"))
    os.chdir(ROOT)
    from amptrain import config as config_lib
    from amptrain.bench.worker import build_trainer, one_batch_repeated
    from amptrain.distribute import distribute_batches

    runs = {}
    for name in names:
        policy, jit = variant(name)
        settings = [
            ("precision.policy", policy),
            ("runtime.jit_compile", jit),
            ("runtime.steps_per_execution", steps),
            ("train.batch_size", BATCH),
            ("data.max_length", LENGTH),
        ]
        task, _, trainer, _ = build_trainer(config_lib.load_config(CONFIG, settings))
        batches = one_batch_repeated(task.train_dataset(0))
        iterator = iter(distribute_batches(trainer.strategy, lambda batches=batches: batches))
        for _ in range(3):  # trace (or compile), then warm up
            trainer.train(iterator, steps)

        def run(n, trainer=trainer, iterator=iterator):
            return int(trainer.train(iterator, n)["tokens"][1])  # padded tokens: batch x 128

        runs[name] = run
    return runs


def build_peer(names, steps):
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    ids = torch.randint(1000, 30000, (BATCH, LENGTH))
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    labels = torch.randint(0, 2, (BATCH,))
    runs = {}
    for name in names:
        model = AutoModelForSequenceClassification.from_pretrained(CHECKPOINT, num_labels=2).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
        bf16 = name == "bf16"

        runs[name] = peer_run(model, optimizer, ids, mask, labels, bf16, steps)
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="training steps a timed call (default 4)")
    parser.add_argument("--peer-venv", default="/tmp/amptrain-peer")
    parser.add_argument("--amptrain", default="float32,mixed_bfloat16,mixed_bfloat16+fusible")
    parser.add_argument("--peer", default="float32,bf16")
    parser.add_argument("--serve", choices=("amptrain", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--dropout", type=float, default=0.1, help=argparse.SUPPRESS)  # the checkpoint's own
    args = parser.parse_args()
    if args.serve:
        build = build_amptrain if args.serve == "amptrain" else build_peer
        serve(lambda names: build(names, args.steps), args.steps)
        return
    if not os.path.isfile(os.path.join(CHECKPOINT, "model.safetensors")):
        sys.exit(f"{CHECKPOINT}: no checkpoint; run `make pretrained` first")

    ours, theirs = args.amptrain.split(","), args.peer.split(",")
    print(f"all-MiniLM-L6-v2, batch {BATCH} x {LENGTH}, {args.steps} steps a call, {args.rounds} rounds", flush=True)
    print(f"load at start {loadavg()}; cpus {os.cpu_count()}", flush=True)
    workers = {
        "amptrain": Worker(sys.executable, "amptrain", ours, args, script=__file__, extra=[]),
        "peer": Worker(peer_python(args.peer_venv), "peer", theirs, args, script=__file__, extra=[]),
    }
    order = [("amptrain", name) for name in ours] + [("peer", name) for name in theirs]
    figures = {key: [] for key in order}
    for index in range(args.rounds):
        load = loadavg()
        for key in order if index % 2 == 0 else order[::-1]:
            figures[key].append(workers[key[0]].ask(key[1])["tokens_per_second"])
        print(f"round {index + 1} load {load}: " + ", ".join(f"{k[0]} {k[1]} {v[-1]:,.0f}" for k, v in figures.items()))
    for worker in workers.values():
        worker.close()
    medians = {key: statistics.median(values) for key, values in figures.items()}
    print(f"medians (tokens/s), load at end {loadavg()}:")
    for (side, name), value in medians.items():
        print(f"  {side:9s} {name:24s} {value:10,.0f}")
    best = {side: max((v, n) for (s, n), v in medians.items() if s == side) for side in ("amptrain", "peer")}
    print(
        f"amptrain best: {best['amptrain'][1]} {best['amptrain'][0]:,.0f}; peer best: {best['peer'][1]} "
        f"{best['peer'][0]:,.0f}"
    )
    print(f"ratio {best['amptrain'][0] / best['peer'][0]:.2f}")


if __name__ == "__main__":
    main()
