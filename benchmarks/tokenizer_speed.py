"""Each family's tokenizer over the spam training split, as a task encodes it: texts a second
and the peak memory it added, each in a process of its own (a process's peak never falls).

    .venv/bin/python benchmarks/tokenizer_speed.py [--rounds 3] [--graph-texts 64]

Rows: `wordpiece` (the project's own vocabulary, learned from the split as a fit does),
`bert`, `distilbert` (WordPiece), `roberta` (byte-level BPE, `tokenizers`), `xlm-roberta`,
`albert` (SentencePiece), on the tiny checkpoints of tests/pretrained, and `roberta-graph`:
keras-hub's BytePairTokenizer (the export's in-graph BPE) on the first `--graph-texts`
mails only, since on the whole split it ran out of time and memory. Texts/s is the median
of `--rounds` encodes after a first one (which traces the graph); peak is the process's
high-water mark minus what it held before the first encode. Last line: each row's texts/s
against `wordpiece`'s.
"""

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPAM = os.path.join(ROOT, "data", "classify-spam", "train.csv")
TINY = os.path.join(ROOT, "tests", "pretrained")
FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "albert")


def mails():
    with open(SPAM, encoding="utf-8", newline="") as f:
        return [row[0] for row in list(csv.reader(f))[1:]]


def tokenizer_of(row):
    if row == "wordpiece":
        from amptrain.data.vocabulary import WordPiece, train_vocabulary

        return WordPiece(train_vocabulary(mails(), size=8000), lowercase=True)
    from amptrain.config.pretrained import read_checkpoint
    from amptrain.models.families import family_of

    checkpoint = read_checkpoint(os.path.join(TINY, "tiny-" + row.removesuffix("-graph")))
    return family_of(checkpoint).tokenizer(checkpoint)


def measure(row, rounds, graph_texts):
    """{"row", "texts", "texts_per_second", "peak_mib"} of one row, in this process."""
    import tensorflow as tf

    texts = mails()
    tokenizer = tokenizer_of(row)
    if row.endswith("-graph"):
        texts = texts[:graph_texts]
        graph = tf.function(tokenizer.graph_tokenize, autograph=False)

        def encode(batch):
            return graph(tf.constant(batch)).flat_values.numpy()
    else:
        encode = tokenizer.encode
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    encode(texts)  # the first: traces a graph where there is one
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        encode(texts)
        seconds.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    median = statistics.median(seconds)
    return {"row": row, "texts": len(texts), "texts_per_second": len(texts) / median, "peak_mib": peak / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--graph-texts", type=int, default=64)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.rounds, args.graph_texts)))
        return
    results = []
    for row in ("wordpiece", *FAMILIES, "roberta-graph"):
        command = [sys.executable, __file__, "--worker", row, "--rounds", str(args.rounds)]
        command += ["--graph-texts", str(args.graph_texts)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{row:14} {result['texts']:5} texts  {result['texts_per_second']:10,.0f} texts/s  "
            f"peak +{result['peak_mib']:7,.1f} MiB",
            flush=True,
        )
    base = results[0]["texts_per_second"]
    print("against wordpiece: " + ", ".join(f"{r['row']} {r['texts_per_second'] / base:.2f}" for r in results))


if __name__ == "__main__":
    main()
