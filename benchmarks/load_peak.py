"""The peak resident memory while a pretrained causal LM is built and its LoRA base held as
`train.base_weights` says, in a fresh process (SmolLM2-135M-Instruct by default: `make
pretrained-llm`).

    .venv/bin/python benchmarks/load_peak.py int8 [--policy mixed_bfloat16] [--folder DIR]

Prints the process's resident memory after importing TensorFlow and keras-hub (the runtime),
then the peak and the resident memory once the model is built and its base held, the seconds
that took, and the weights by dtype. One mode a process: a peak is a process's.
"""

import argparse
import collections
import os
import resource
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mib_now_and_peak():
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["float32", "compute", "int8", "int4"])
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument("--folder", default=os.path.join(ROOT, "pretrained", "SmolLM2-135M-Instruct"))
    args = parser.parse_args()
    import keras_hub  # noqa: F401 - the runtime, as a run imports it
    import tensorflow  # noqa: F401

    from amptrain.config.pretrained import read_checkpoint
    from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

    now, peak = mib_now_and_peak()
    print(f"runtime: {now:,.0f} MiB resident (peak {peak:,.0f})")
    checkpoint = read_checkpoint(args.folder)
    start = time.perf_counter()
    model = PretrainedLanguageModel(checkpoint, 128, 0.0, args.policy, base_weights=args.mode)
    seconds = time.perf_counter() - start
    now, peak = mib_now_and_peak()
    by_dtype = collections.Counter()
    for variable in model.weights:
        by_dtype[variable.dtype] += variable.numpy().nbytes / 2**20
    held = ", ".join(f"{dtype} {size:,.0f} MiB" for dtype, size in sorted(by_dtype.items()))
    print(f"{args.mode} under {args.policy}: built in {seconds:.1f} s, peak {peak:,.0f} MiB, now {now:,.0f}; {held}")


if __name__ == "__main__":
    main()
