"""What a greedy generation step of a pretrained Llama costs, keras-hub's cached layer call
against the lean step (`tasks/language_model/families/decoding.py`), and what a whole
batch of chat replies costs with and without the prefill of the prompts.

    make pretrained-llm
    .venv/bin/python -u benchmarks/decode_step.py [--rows 1,32,64] [--rounds 5] [--set KEY=VALUE]...

The model is the chat config's (configs/chat-smollm2-en-es.toml: SmolLM2-135M-Instruct,
LoRA rank 16 on all seven projections, mixed_bfloat16 unless --set says otherwise). A step
is timed as 20 positions of the cached loop in one graph call (the median over rounds of
the call's time / 20), both paths interleaved round by round. Then the first 64 test
prompts are answered through `conversations.generate_replies` (96 new pieces at most, 32
rows at once), the lean path with the prefill and, for the ratio, with the prompts' positions
written one a step (the median of the rounds after the first, which traces).
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def build(overrides):
    from amptrain.config import load_config
    from amptrain.tasks import create_task

    config = load_config(os.path.join(ROOT, "configs/chat-smollm2-en-es.toml"), overrides, base_dir=ROOT)
    run_dir = os.path.join("/tmp", f"decode-step-{os.getpid()}")
    os.makedirs(run_dir, exist_ok=True)
    task = create_task(config, run_dir)
    task.prepare(("test",))
    model, policy, _ = task.create_model()
    return task, model, policy


def step_loop(model, lean):
    """A graph call running `count` greedy positions from position 0, on the lean path or keras-hub's."""
    import tensorflow as tf

    family = model.family

    @tf.function(autograph=False)
    def run(ids, count):
        model.family = dataclasses.replace(family, lean_decoding=lean)
        try:
            caches = model.empty_caches(tf.shape(ids)[0], model.max_length)
            weights = model.decoding_weights()

            def body(t, ids, caches):
                logits, caches = model.step(ids, t, caches, weights)
                return t + 1, tf.argmax(logits, axis=-1, output_type=tf.int32), caches

            return tf.while_loop(lambda t, *_: t < count, body, (tf.constant(0), ids, caches))[1]
        finally:
            model.family = family

    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,32,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    import tensorflow as tf

    from amptrain.tasks.language_model import conversations, generation

    task, model, policy = build(args.overrides)
    print(f"{policy}; {os.cpu_count()} cores; positions a call: 20", flush=True)
    paths = {"keras-hub": step_loop(model, False), "lean": step_loop(model, True)}
    for rows in [int(r) for r in args.rows.split(",")]:
        ids = tf.fill((rows,), task.eod_id)
        times = {name: [] for name in paths}
        for run in paths.values():
            run(ids, tf.constant(2))  # traced and warm
        for _ in range(args.rounds):
            for name, run in paths.items():
                start = time.perf_counter()
                run(ids, tf.constant(20)).numpy()
                times[name].append((time.perf_counter() - start) / 20 * 1000)
        old, new = (statistics.median(times[n]) for n in paths)
        print(f"rows {rows:3d}: keras-hub {old:7.1f} ms a step, lean {new:6.1f} ms ({old / new:.2f}x)", flush=True)

    prompts = [ids for ids, _, _ in task.splits["test"].encoded["held_out"][:64]]
    traced, prefill = generation._generate.python_function, model.prefill
    for label, fill in (("lean, prefill", prefill), ("lean, one position a step", one_a_step(model))):
        model.prefill = fill
        generation._generate = tf.function(traced, autograph=False, reduce_retracing=True)  # traced anew
        rounds = []
        for _ in range(max(2, args.rounds // 2 + 1)):
            start = time.perf_counter()
            conversations.generate_replies(task, model, prompts)
            rounds.append(time.perf_counter() - start)
        print(f"64 replies, {label}: {statistics.median(rounds[1:]):.1f} s (the first, traced: {rounds[0]:.1f} s)")
    model.prefill = prefill


def one_a_step(model):
    """A prefill that writes the prompt's positions one a step, as the loop did before it had one."""
    import tensorflow as tf

    def prefill(ids, caches, weights):
        def body(t, caches):
            return t + 1, model.step(ids[:, t], t, caches, weights)[1]

        return tf.while_loop(lambda t, _: t < tf.shape(ids)[1], body, (tf.constant(0), caches))[1]

    return prefill


if __name__ == "__main__":
    main()
