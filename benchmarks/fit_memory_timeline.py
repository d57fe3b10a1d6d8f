"""Where a `fit` process's memory goes, over time: the resident set, split into anonymous
memory and mapped files, beside what TensorFlow's CPU tensors hold, and where in amptrain's
code the main thread is.

    .venv/bin/python benchmarks/fit_memory_timeline.py [--every 0.5] [--out timeline.txt] -- CONFIG [fit's options]

TensorFlow counts its CPU tensors only with its BFC allocator, which this script turns on
(`TF_CPU_ALLOCATOR_USE_BFC=true`, before TensorFlow is imported; the process then allocates
tensors from TensorFlow's own pool, which may move the peak a little). A line every `--every`
seconds: seconds, resident MiB, anonymous MiB, file-backed MiB, tensors now and their peak
so far (MiB), and the innermost four of amptrain's frames on the main thread (none: inside
TensorFlow's C++ or before amptrain runs). Resident memory that is neither a tensor nor a
mapped file is the runtimes' own: imports, traced graphs, instantiated functions.
"""

import argparse
import os
import runpy
import sys
import threading
import time
import traceback


def status():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(line.split()[1]) // 1024
    return fields


def tensors():
    try:  # TensorFlow half imported has no `config` yet
        info = sys.modules["tensorflow"].config.experimental.get_memory_info("CPU:0")
    except (KeyError, AttributeError, ValueError):
        return "    -     -"
    return f"{info['current'] >> 20:5d} {info['peak'] >> 20:5d}"


def where(main):
    frame = sys._current_frames().get(main)
    frames = traceback.extract_stack(frame) if frame is not None else []
    ours = [f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in frames if "/amptrain/" in f.filename]
    return " > ".join(ours[-4:])


def sample(out, every, main):
    start = time.time()
    out.write("seconds   rss  anon  file  tensors  peak  where\n")
    while True:
        fields = status()
        out.write(
            f"{time.time() - start:7.1f} {fields['VmRSS']:5d} {fields['RssAnon']:5d} {fields['RssFile']:5d}"
            f"    {tensors()}  {where(main)}\n"
        )
        out.flush()
        time.sleep(every)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("--out", default="-", help="a file, or - for standard output")
    parser.add_argument("fit", nargs=argparse.REMAINDER, help="-- then fit's arguments")
    args = parser.parse_args()
    fit = args.fit[1:] if args.fit[:1] == ["--"] else args.fit
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    thread = threading.Thread(target=sample, args=(out, args.every, threading.main_thread().ident), daemon=True)
    thread.start()
    sys.argv = ["amptrain", "fit", *fit]
    runpy.run_module("amptrain", run_name="__main__")


if __name__ == "__main__":
    main()
