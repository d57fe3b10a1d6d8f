"""`amptrain bench` end to end on the tiny config, and the structure of what it writes."""

import json

import pytest

from amptrain.bench.memory_plan import parse_memory
from amptrain.bench.report import format_table, markdown_report
from amptrain.bench.runner import add_ratios
from amptrain.cli import main
from amptrain.errors import UserError


def row(precision, jit, spe, real, batch=8):
    return {
        "precision": precision,
        "jit": jit,
        "steps_per_execution": spe,
        "batch_size": batch,
        "real_tokens_per_second": real,
        "padded_tokens_per_second": 2 * real,
        "flops_per_token": 1000.0,
    }


def test_ratios_against_the_float32_no_xla_spe1_row():
    rows = [
        row("float32", False, 1, 100.0),
        row("float32", True, 4, 150.0),
        row("mixed_bfloat16", True, 4, 250.0, batch=16),
    ]
    peaks = {"float32": (1e6, "measured"), "mixed_bfloat16": (2e6, "measured")}
    add_ratios(rows, peaks, default_batch_size=8)
    assert [r["speedup"] for r in rows] == [1.0, 1.5, None]  # no float32 baseline at batch 16
    assert rows[1]["mfu"] == pytest.approx(1000 * 150 / 1e6)
    assert rows[1]["mfu_padded"] == pytest.approx(1000 * 300 / 1e6)
    assert rows[2]["mfu"] == pytest.approx(1000 * 250 / 2e6)


def test_a_data_sheet_peak_counts_every_accelerator_and_a_measured_cpu_peak_once():
    rows = [
        {**row("float32", False, 1, 100.0), "num_replicas": 2},
        {**row("mixed_bfloat16", False, 1, 100.0), "num_replicas": 2},
    ]
    add_ratios(rows, {"float32": (1e6, "A100 tf32 peak (data sheet)"), "mixed_bfloat16": (1e6, "CPU: measured")}, 8)
    assert rows[0]["peak_flops"] == 2e6 and rows[0]["peak_source"] == "2 x A100 tf32 peak (data sheet)"
    assert rows[1]["peak_flops"] == 1e6  # two logical CPU devices share the one CPU that was measured


def test_memory_sizes():
    assert parse_memory("8GiB") == 8 * 2**30
    assert parse_memory("512MiB") == 512 * 2**20
    assert parse_memory("1.5G") == int(1.5 * 2**30)
    assert parse_memory("1000") == 1000
    with pytest.raises(UserError, match=r"--memory-limit: expected a size"):
        parse_memory("lots")


def test_bench_says_which_row_auto_would_choose(monkeypatch):
    from amptrain import config as config_lib
    from amptrain.autoprecision import probe
    from amptrain.bench.runner import auto_choice

    amx = probe.Hardware(cpu_flags=frozenset({"amx_bf16", "avx512_bf16"}))
    monkeypatch.setattr(probe.Hardware, "detect", classmethod(lambda cls: amx))
    train = str(__import__("pathlib").Path(__file__).parents[2] / "data" / "classify-spam" / "train.csv")
    config = config_lib.config_from_dict(
        {"data": {"train": train}, "runtime": {"steps_per_execution": 4}, "train": {"batch_size": 8}}
    )
    rows = [
        row("float32", False, 1, 100.0),
        row("float32", True, 1, 150.0),
        row("mixed_bfloat16", False, 1, 140.0),
        row("float32", False, 20, 110.0),
        row("float32", True, 20, 120.0),
        row("mixed_bfloat16", False, 20, 300.0),
        row("mixed_bfloat16", True, 20, 301.0),
        row("mixed_float16", False, 20, 999.0),  # never a candidate on a CPU
        row("mixed_bfloat16", True, 20, 500.0, batch=16),  # not the config's batch
    ]
    # spe 1 is nearer the config's 4 than 20 is (|1-4| < |20-4|), so the spe-1 rows decide
    assert auto_choice(config, rows).startswith(
        "by speed alone auto would choose float32+XLA (fastest measured: float32+XLA 150"
    )
    assert "not in this grid: bf16+XLA" in auto_choice(config, rows)
    config = config_lib.config_from_dict(
        {"data": {"train": train}, "runtime": {"steps_per_execution": 16}, "train": {"batch_size": 8}}
    )
    # bf16 300 and bf16+XLA 301 tie: XLA off wins
    assert auto_choice(config, rows).startswith("by speed alone auto would choose bf16 (bf16 300 tokens/s, within 3%")


@pytest.mark.slow
def test_bench_runs_a_tiny_config_and_writes_three_kinds_of_file(tiny, capsys, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_FORK", "0")
    status = main(
        [
            "bench",
            str(tiny / "tiny.toml"),
            "--run-dir",
            str(tiny / "run"),
            "--precisions",
            "float32",
            "--jit",
            "off",
            "--steps-per-execution",
            "1,2",
            "--steps",
            "2",
            "--repeats",
            "1",
        ]
    )
    assert status == 0
    out = capsys.readouterr().out
    bench = tiny / "run" / "bench"
    results = json.loads((bench / "results.json").read_text())
    assert {"peak_flops", "peak_source", "rows"} <= set(results)
    assert results["peak_source"].startswith("CPU: a 2048x2048 float32 matrix product")
    keys = {
        "precision",
        "jit",
        "steps_per_execution",
        "batch_size",
        "real_tokens_per_second",
        "padded_tokens_per_second",
        "step_time_p50",
        "mfu",
        "peak_memory_bytes",
        "speedup",
    }
    assert len(results["rows"]) == 2 and all(keys <= set(r) for r in results["rows"])
    first = results["rows"][0]
    assert first["speedup"] == 1.0 and 0 < first["mfu"] < 1 and first["peak_memory_bytes"] > 0
    assert first["real_tokens"] == 2 * 8 * 32  # 2 steps of 8 rows, all 32 pieces long (every row is truncated)
    assert first["examples"] == 2 * 8
    report = (bench / "report.md").read_text()
    assert "matrix product, measured in this run" in report and "| MFU |" in report
    assert (bench / "throughput.png").stat().st_size > 0 and (bench / "memory.png").stat().st_size > 0
    assert "real tok/s" in out and "results in" in out
    # AMPTRAIN_FORK=0: the workers are new Pythons (test_bench_honours_the_strategy_keys forks them).
    assert "each measurement in a process of its own, a new Python" in out
    assert "by speed alone auto would choose float32 (" in out and "rows at steps_per_execution 1" in out
    assert results["auto_choice"] + "." in report


def test_bad_lists_are_refused(tiny, capsys):
    assert main(["bench", str(tiny / "tiny.toml"), "--precisions", "float8"]) == 2
    assert "--precisions: cannot read 'float8'" in capsys.readouterr().err


def test_table_and_report_from_results():
    rows = add_ratios([row("float32", False, 1, 100.0)], {"float32": (1e6, "measured")}, 8)
    for r in rows:
        r.update(
            examples_per_second=3.0,
            step_time_p10=0.01,
            step_time_p50=0.02,
            step_time_p90=0.03,
            compile_seconds=1.0,
            peak_memory_bytes=2**30,
            peak_memory_source="process peak RSS",
        )
    assert "1.00x" in format_table(rows) and "1,024" in format_table(rows)
    results = {
        "config": "c.toml",
        "overrides": [],
        "steps": 2,
        "repeats": 1,
        "data": "real",
        "peaks": {"float32": {"flops": 1e9, "source": "measured"}},
        "rows": rows,
        "environment": {
            "cpu": "x",
            "cpu_count": 2,
            "cpu_flags": [],
            "accelerators": [],
            "platform": "p",
            "python": "3",
            "tensorflow": "2",
            "keras": "3",
        },
    }
    text = markdown_report(results, ["throughput.png"])
    assert "## Hardware and versions" in text and "![throughput.png](throughput.png)" in text


def test_max_batch_doubles_then_bisects(monkeypatch):
    # The search alone, with a fake worker whose peak is 1 MiB a row: under a 100 MiB limit
    # 8, 16, 32, 64 fit, 128 does not; bisection tries 96 (fits), 112 and 104 (do not).
    from amptrain.bench import runner

    def fake_worker(spec):
        batch = dict(spec["overrides"])["train.batch_size"]
        return {"peak_memory_bytes": batch * 2**20}

    monkeypatch.setattr(runner, "run_worker", fake_worker)
    largest, tried = runner.find_max_batch(
        "c.toml", [], "float32", True, 8, 100 * 2**20, start=8, progress=lambda _: None
    )
    assert largest == 96
    assert list(tried) == [8, 16, 32, 64, 128, 96, 112, 104]
    nothing, _ = runner.find_max_batch("c.toml", [], "float32", True, 8, 2**20, start=8, progress=lambda _: None)
    assert nothing is None


def test_max_batch_bisection_stops_at_a_sixteenth_of_the_batch(monkeypatch):
    # 1 MiB a row under a 1000 MiB limit: 8 ... 512 fit, 1024 does not; bisection tries
    # 768, 896, 960 (all fit), then 992 (fits: 1024 - 960 = 64 rows is more than 960 / 16 = 60);
    # 1024 - 992 = 32 rows is within 992 / 16, so the search stops at 992 (the exact answer is 1000).
    from amptrain.bench import runner

    monkeypatch.setattr(
        runner, "run_worker", lambda spec: {"peak_memory_bytes": dict(spec["overrides"])["train.batch_size"] * 2**20}
    )
    largest, tried = runner.find_max_batch(
        "c.toml", [], "float32", True, 8, 1000 * 2**20, start=8, progress=lambda _: None
    )
    assert largest == 992
    assert list(tried) == [8, 16, 32, 64, 128, 256, 512, 1024, 768, 896, 960, 992]


def test_max_batch_reports_why_a_trial_failed(monkeypatch):
    from amptrain.bench import runner

    def failing_worker(spec):
        raise RuntimeError("benchmark worker failed (combination, exit 1):\nValueError: something broke")

    monkeypatch.setattr(runner, "run_worker", failing_worker)
    lines = []
    largest, tried = runner.find_max_batch("c.toml", [], "float32", True, 8, 2**30, start=32, progress=lines.append)
    assert largest is None and tried == {32: None, 16: None, 8: None}  # smaller batches tried, down to 8
    assert lines[0] == "  float32: batch 32 failed (ValueError: something broke) does not fit"


def test_max_batch_from_an_estimate_steps_an_eighth_at_a_time(monkeypatch):
    # The estimate said 200 rows; at 1 MiB a row under 100 MiB the search steps down by an
    # eighth (200, 176, 152, 128, 112, 96: fits), then bisects once (104 does not fit).
    from amptrain.bench import runner

    monkeypatch.setattr(
        runner, "run_worker", lambda spec: {"peak_memory_bytes": dict(spec["overrides"])["train.batch_size"] * 2**20}
    )
    largest, tried = runner.find_max_batch(
        "c.toml", [], "float32", False, 1, 100 * 2**20, start=200, progress=lambda _: None, growth=1.125
    )
    assert largest == 96
    assert list(tried) == [200, 176, 152, 128, 112, 96, 104]
    largest, tried = runner.find_max_batch(
        "c.toml", [], "float32", False, 1, 100 * 2**20, start=80, progress=lambda _: None, growth=1.125
    )
    assert largest == 96 and list(tried) == [80, 88, 96, 104]


@pytest.mark.slow
def test_a_token_batched_config_is_timed_by_its_rows(tiny_translation, capsys):
    """Under `data.tokens_per_batch` the rows vary by bucket: the bench counts the rows
    the trainer ran (examples/s, and the mean padded length behind the attention FLOPs)
    and labels the batch by its budget; options that set `train.batch_size` are refused."""
    config = str(tiny_translation / "tiny.toml")
    run_dir = str(tiny_translation / "bench-run")
    status = main(
        [
            "bench",
            config,
            "--run-dir",
            run_dir,
            "--precisions",
            "float32",
            "--jit",
            "off",
            "--steps-per-execution",
            "1",
            "--steps",
            "3",
            "--repeats",
            "1",
        ]
    )
    assert status == 0
    assert "320 tok" in capsys.readouterr().out
    (result,) = json.loads(open(f"{run_dir}/bench/results.json").read())["rows"]
    assert result["batch_size"] is None and result["tokens_per_batch"] == 320
    # Buckets of 24 and 40 pieces at most: 320 tokens fit 13 and 8 rows, rounded down to
    # a multiple of 8: every batch has 8 rows, whatever train.batch_size (32) says.
    assert result["examples"] == 8 * result["steps_run"] == 24
    assert result["mean_padded_length"] == pytest.approx(result["padded_tokens"] / 24)
    for option in (["--batch-sizes", "8,16"], ["--max-batch"]):
        assert main(["bench", config, "--run-dir", run_dir, *option]) == 2
        assert f"{option[0]}: this config batches by tokens (data.tokens_per_batch = 320)" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_honours_the_strategy_keys(tiny):
    """`--set runtime.cpu_replicas=2`: each combination runs mirrored over 2 logical CPUs."""
    from engine.test_distribution import amptrain_cli

    result = amptrain_cli(
        [
            "bench",
            str(tiny / "tiny.toml"),
            "--run-dir",
            str(tiny / "run"),
            "--precisions",
            "float32",
            "--jit",
            "off",
            "--steps-per-execution",
            "2",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--set",
            "runtime.cpu_replicas=2",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tiny / "run" / "bench" / "results.json").read_text())["rows"]
    assert [(r["strategy"], r["num_replicas"]) for r in rows] == [("mirrored", 2)]
    assert all(r["examples"] == 2 * 8 for r in rows)  # 2 steps of the global batch of 8, 4 a replica
    assert "replicas" in result.stdout
    # A command that has only imported TensorFlow forks its workers (forked.py), mirrored ones too.
    assert "each measurement in a process of its own, forked after the import" in result.stdout


def test_the_real_data_warm_up_serves_a_language_models_blocks(tmp_path):
    """`bench --data real` compiles each bucket's shape first; a language model has one (its
    blocks), which the warm-up took for a bucketed text task's and failed on."""
    from tasks.test_language_model import write_tiny_corpus

    from amptrain.bench.worker import one_batch_per_shape
    from amptrain.config import load_config
    from amptrain.tasks import create_task

    folder = write_tiny_corpus(tmp_path)
    task = create_task(load_config(str(folder / "tiny.toml")), str(tmp_path))
    task.prepare(("train",))
    features, _, _ = next(iter(one_batch_per_shape(task)))
    assert features["token_ids"].shape == (8, 32)  # train.batch_size rows of data.max_length


def test_the_report_says_the_parameters_trained_and_their_bytes():
    from amptrain.bench.report import variables_line

    rows = [dict(row("float32", "off", 1, 100.0), parameters=1_000_000, trainable_parameters=20_000,
                 weights_bytes=4 * 2**20, gradients_bytes=80_000, optimizer_slots_bytes=160_008)]  # fmt: skip
    assert variables_line(rows) == (
        "parameters: 1,000,000, 20,000 trained (2.0%); weights 4.0 MiB, gradients 0.1 MiB, optimizer slots 0.2 MiB"
    )
    assert variables_line([row("float32", "off", 1, 100.0)]) == ""  # results of an older bench
