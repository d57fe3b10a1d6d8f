"""Where the profiled steps of a run went: the op time of its trace by part of the step.

    amptrain fit configs/classify-spam.toml --set "runtime.profile_steps=[61, 72]" --set train.steps=100
    python benchmarks/profile_breakdown.py runs/classify-spam

Reads the `runtime.profile_steps` trace (`tensorboard/plugins/profile/*/*.xplane.pb`) with
TensorFlow's own XPlane reader and sums the TensorFlow ops run on the CPU's compute threads
by their name: the backward pass is what `GradientTape` named `gradient_tape/`, the update
the optimizer's ops, the loss scaler and clipping (inside the step's skip `cond`), the
forward pass the model's ops; the input is the time the step's pull waited for the next
batch (`tf_data_iterator_get_next`). Op times on two threads add up to more than the wall
time of the graph calls, which is printed beside them.
"""

import collections
import sys

UPDATE = ("adam_w", "adam/", "clip", "global_norm", "loss_scale", "/cond/")


def part(op_name):
    if "gradient_tape/" in op_name:
        return "backward"
    if any(key in op_name for key in UPDATE):
        return "update (optimizer, clipping, the skip cond)"
    if "StatefulPartitionedCall/" in op_name:
        return "forward (the model and the loss)"
    return "other (counters, totals, copies)"


def breakdown(run_dir):
    from amptrain.engine.profiling import host_events

    totals, calls = collections.Counter(), 0
    for thread, name, picoseconds in host_events(f"{run_dir}/tensorboard"):
        if thread == "python" and "__inference__train_loop_impl" in name:
            calls += picoseconds
        elif thread.startswith("tf_data_iterator_get_next"):
            totals["input (waiting for the next batch)"] += picoseconds
        elif thread.startswith("tf_Compute") and ":" in name and not name.startswith("ExecutorState"):
            totals[part(name)] += picoseconds
    return totals, calls


def main(run_dir):
    totals, calls = breakdown(run_dir)
    every = sum(totals.values())
    print(f"graph calls: {calls / 1e9:,.0f} ms wall; op time: {every / 1e9:,.0f} ms over the compute threads")
    for name, picoseconds in totals.most_common():
        print(f"  {name:<45} {picoseconds / 1e9:7,.0f} ms  {picoseconds / every:6.1%}")


if __name__ == "__main__":
    main(sys.argv[1])
