"""The memory estimate before training: `amptrain doctor --memory` for a config and
`Trainer.memory()` for a user's model, counted from the variables and the traced step."""

import json

import pytest
from test_trainer_api import make

from amptrain import cli
from amptrain.engine.memory import Estimate


def test_the_parts_add_up_and_the_largest_batch_fits_the_budget():
    estimate = Estimate("float32", 400, 400, 800, 100, 1000.0, 600.0, 2**20, 100, 100)
    assert estimate.total(0) == 2**20 + 1300  # the gradients (400) are within the step's peak (static)
    assert estimate.total(10) == 2**20 + 1300 + 10_000
    budget = 2**20 + 1300 + 20_500  # room for 20.5 rows: 16, the multiple of 8 below
    assert estimate.largest_batch(budget) == 16
    assert estimate.largest_batch(budget, multiple=1) == 20
    assert estimate.largest_batch(2**20) == 0
    assert estimate.run_total(10) == estimate.total(10)  # no evaluation holds more
    estimate.evaluation = {"decoding_weights": 15_000, "caches": 5_000}  # generated replies
    assert estimate.run_total(10) == 2**20 + 1200 + 20_000  # fixed, weights, slots and the generation's parts
    assert estimate.run_total(30) == estimate.total(30)  # 30 rows' step holds more
    assert estimate.as_record(10)["run_total_bytes"] == 2**20 + 21_200


def test_runtime_growth_is_what_a_call_leaves_resident():
    import numpy as np

    from amptrain.engine.memory import runtime_growth

    kept = []
    assert runtime_growth(lambda: kept.append(np.ones(64 * 2**20 // 8))) >= 60 * 2**20  # 64 MiB written, kept
    assert runtime_growth(lambda: np.ones(64 * 2**20 // 8).sum()) < 16 * 2**20  # freed when it returns


def test_the_steps_walk_holds_what_the_step_returns_to_its_end():
    """A gradient is made while activations are still alive and held to the step's end: the walk
    counts it from its op on, and freed neither at its last read within the step."""
    import tensorflow as tf

    from amptrain.engine.memory import graph_memory

    def step(x):  # 1,000 float32s
        early = x * 2.0  # returned: 4,000 bytes
        late = tf.tile(tf.reshape(tf.reduce_sum(early), (1,)), (10_000,))  # 40,000, after early's last read
        return tf.reduce_sum(late), early

    traced = tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec((1000,), tf.float32))
    peak, _ = graph_memory(traced.graph, traced.outputs[0], traced.outputs)
    assert 44_000 <= peak < 45_000  # freed at its last read, the peak was 40,004


def test_trainer_memory_counts_your_variables_by_hand(tmp_path):
    # Embedding 30 x 16 and Dense 16 -> 2: 480 + 34 = 514 float32 parameters.
    (record,) = make(tmp_path).memory(memory_limit="64GiB")
    assert record["policy"] == "float32"
    assert record["parameters"] == record["trainable_parameters"] == 514
    assert record["weights_bytes"] == record["gradients_bytes"] == 514 * 4
    # AdamW: two slots a variable, and its step counter and learning rate.
    assert 2 * 514 * 4 <= record["optimizer_slots_bytes"] <= 2 * 514 * 4 + 64
    assert 0 < record["kept_for_backward_bytes_per_row"] <= record["activations_bytes_per_row"]
    assert record["batch_size"] == 16 and record["largest_batch"] % 8 == 0 and record["largest_batch"] > 16
    # the runtime is this process's resident memory less the weights and slots counted apart,
    # with the step's function made (run once at a row of ones)
    assert 0 < record["runtime_bytes"] < record["total_bytes"] <= record["memory_limit_bytes"]
    assert record["runtime_holds_the_step_function"] is True


def test_a_built_model_is_estimated_in_its_own_precision_only(tmp_path):
    from test_trainer_api import build

    from amptrain.errors import UserError

    trainer = make(tmp_path, model=build("float32"))
    (record,) = trainer.memory()
    assert record["policy"] == "float32"
    assert record["runtime_holds_the_step_function"] is False  # a step would move your model's state
    with pytest.raises(UserError, match="a built model has one precision"):
        trainer.memory(precisions=("float32", "mixed_bfloat16"))


@pytest.mark.slow
def test_doctor_memory_estimates_each_precision_of_a_config(tiny, capsys):
    config = str(tiny / "tiny.toml")
    # 64 GiB: the runtime is this process's resident memory, a test runner's here
    assert cli.main(["doctor", "--memory", config, "--memory-limit", "64GiB", "--json"]) == 0
    plans = {p["policy"]: p for p in json.loads(capsys.readouterr().out)}
    assert sorted(plans) == ["float32", "mixed_bfloat16", "mixed_float16"]
    float32, bfloat16 = plans["float32"], plans["mixed_bfloat16"]
    assert float32["weights_bytes"] == bfloat16["weights_bytes"]  # float32 variables either way
    assert bfloat16["activations_bytes_per_row"] < 0.75 * float32["activations_bytes_per_row"]
    assert bfloat16["largest_batch"] > float32["largest_batch"]
    assert float32["positions_per_row"] == 32 and float32["batch_size"] == 8 and float32["remat"] == "none"
    assert cli.main(["doctor", "--memory", config, "--set", "model.remat=blocks"]) == 0
    text = capsys.readouterr().out
    assert "model.remat = 'blocks'" in text and "mixed_bfloat16" in text


@pytest.mark.slow
def test_the_estimate_is_within_15_percent_of_a_measured_peak(tiny):
    # The tiny classifier widened so its rows weigh against the runtime: each number from a
    # process of its own, as `bench --max-batch` takes them.
    from amptrain.bench.runner import run_worker

    config = str(tiny / "tiny.toml")
    overrides = [
        "model.num_layers=3",
        "model.hidden_dim=128",
        "model.intermediate_dim=512",
        "data.max_length=128",
        "train.batch_size=96",
        "runtime.jit_compile=false",
    ]
    for precision in ("float32", "mixed_bfloat16"):
        settings = [*overrides, f"precision.policy={precision}"]
        estimate = run_worker({"kind": "estimate", "config": config, "overrides": settings, "precision": precision})
        measured = run_worker(
            {
                "kind": "combination",
                "config": config,
                "overrides": settings,
                "steps": 1,
                "repeats": 1,
                "data": "synthetic",
            }
        )
        assert estimate["batch_size"] == 96 and measured["examples"] == 96  # one step of 96 rows
        assert abs(estimate["total_bytes"] / measured["peak_memory_bytes"] - 1) < 0.15, (estimate, measured)
