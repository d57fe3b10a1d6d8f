"""Precision parity: a tiny classifier trained the same 24 steps from the same seed in
float32, mixed_bfloat16 and mixed_float16 ends at the same loss, within what each half
format's rounding explains."""

import pytest

import amptrain
from amptrain.engine.run_log import read_metrics

# Loss of each `train` record (the mean of the last 4 steps) against float32's, measured
# on the 2-core CPU this was written on (TF 2.21, Keras 3.15); runs are deterministic.
#   final loss:      float32 0.57001, mixed_bfloat16 0.57138 (+1.4e-3), mixed_float16 0.57003 (+2e-5)
#   worst record:    mixed_bfloat16 1.9e-3 off (step 12), mixed_float16 1.3e-4 off (step 16)
# The tolerances are about 3x (bf16) and 4x (fp16) the worst record, and scale with each
# format's precision (8 and 11 significant bits). A step that is skipped or applied twice
# is far outside them: fp16 at the default initial loss scale 2^15 skips its first step
# (an overflow) and ends at 0.55122, 1.9e-2 off, with the step-8 record 0.10 off.
# Not caught, measured too: computing the attention softmax, the pooling sum or the
# logits and loss in half precision moves this tiny model's final loss by under 1.1e-3
# (bf16) and 1.3e-4 (fp16), inside each format's own rounding noise here.
TOLERANCE = {"mixed_bfloat16": 5e-3, "mixed_float16": 5e-4}
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def train_records(tiny, policy):
    amptrain.fit(
        str(tiny / "tiny.toml"),
        [
            f"precision.policy={policy}",
            # 2^10 does not overflow on this model, so no fp16 step is skipped and every
            # policy applies the same 24 updates (float32 and bf16 ignore the scale).
            "precision.initial_scale=1024",
            "runtime.deterministic=true",
            "runtime.seed=0",
            "model.dropout=0.0",
            "train.steps=24",
            "train.batch_size=8",
            "train.log_every=4",
            # Evaluate and checkpoint only at the end: fp16 is emulated on a CPU, slow.
            "train.eval_every=24",
            "train.checkpoint_every=24",
        ],
        run_dir=str(tiny / policy),
    )
    return [r for r in read_metrics(tiny / policy / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.slow
def test_final_losses_agree_across_policies(tiny):
    records = {policy: train_records(tiny, policy) for policy in POLICIES}
    for policy, train in records.items():
        assert [r["step"] for r in train] == [4, 8, 12, 16, 20, 24], policy
        assert all(r["skipped_steps"] == 0 for r in train), policy  # the same number of updates
        assert train[-1]["loss"] < 0.8 * train[0]["loss"], policy  # it learned: 0.92 -> 0.57
    reference = [r["loss"] for r in records["float32"]]
    for policy, tolerance in TOLERANCE.items():
        losses = [r["loss"] for r in records[policy]]
        assert abs(losses[-1] - reference[-1]) <= tolerance, (policy, losses[-1], reference[-1])
        # Every record, not only the last: a divergence that closes again is a bug too.
        worst = max(abs(a - b) for a, b in zip(losses, reference))
        assert worst <= tolerance, (policy, losses, reference)
