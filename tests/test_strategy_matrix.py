"""Every strategy x XLA x task trains, evaluates and predicts, and gives one device's weights.

Strategy {one device (in this process), `mirrored` over 2 logical CPUs (an `amptrain fit`
process: logical devices are set before TensorFlow starts), 2 local workers through
`amptrain launch`} x `jit_compile` {on, off} x task {classification, NER, translation,
language model}.
Each cell: a tiny float32 `fit` of 4 steps in graph calls of 2 with a dev evaluation at
steps 2 and 4 and the final test; then `amptrain eval` and `amptrain predict` on its run
folder (here, through `cli.main`); then its weights and its weight average
(`train.ema_decay`) at step 4 against the one-device run with the same XLA setting, within
test_distribution.py's float32 bounds. Translation batches by tokens (`data.tokens_per_batch`),
so its cells cover token batches over 2 replicas, and its test translations, written by the
chief alone, must equal one device's. The language model's cells cover its packed blocks split over
replicas and workers, and its cross-entropy made a chunk of logits at a time.

Every cell reads one vocabulary per task, the one-device run's, rather than training its
own: the same file gives the same vocabulary in every process
(tests/data/test_vocabulary.py), so this only saves each cell that work.

Run with `-s` to see each cell's wall time and weight difference (the `matrix` lines). The
mirrored and launched cells run in the background, two at a time, while this process
trains the one-device cells: their times overlap.
"""

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_tiny
from engine.test_distribution import amptrain_cli
from tasks.test_language_model import write_tiny_corpus

import amptrain
from amptrain import cli
from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow

# One device float32, 4 steps; workers and replicas must agree to float32 rounding.
SAME_RUN = [
    "runtime.deterministic=true",
    "model.dropout=0.0",
    "precision.policy=float32",
    "runtime.steps_per_execution=2",
    "train.steps=4",
    "train.eval_every=2",
    "train.checkpoint_every=4",
    "train.log_every=2",
    "train.ema_decay=0.9",  # the weight average too: dev and the best checkpoint use it
    # Cost: every batch shape is a trace and (XLA) a compile per replica, and beam search
    # one more compile than greedy; one shape and greedy decoding keep the 18 cells cheap.
    "data.num_buckets=1",
]
DECODE = {"translation": ["decode.beam_size=1"]}
BOUNDS = (1e-6, 1e-4)  # (RMS, largest): test_distribution.py's float32 tolerance
TASKS = ("classification", "ner", "translation", "language_model")
PRIMARY = {"classification": "accuracy", "ner": "entity_f1", "translation": "bleu", "language_model": "bits_per_byte"}
TEXTS = {
    "language_model": "And God said",
    "classification": "WIN a FREE cruise, click now",
    "ner": "Barack Obama flew to Paris on Monday",
    "translation": "I would like a cup of coffee .",
}
STRATEGIES = ("one_device", "mirrored", "launch")
CELLS = [(strategy, jit, task) for strategy in STRATEGIES for jit in (False, True) for task in TASKS]


def check_projector(run_dir, task):
    """The best checkpoint's token embeddings for TensorBoard's projector: each table's rows
    are the vocabulary's (under the default cap), its metadata a line a row, in id order,
    with a header line only where it has two columns (the language model's counts)."""
    from google.protobuf import text_format
    from tensorboard.plugins.projector import projector_config_pb2

    from amptrain.engine.projector import cell

    folder = run_dir / "tensorboard" / "train"
    config = text_format.Parse((folder / "projector_config.pbtxt").read_text(), projector_config_pb2.ProjectorConfig())
    reader = tf.train.load_checkpoint(str(folder))
    assert config.embeddings
    for embedding in config.embeddings:
        rows = reader.get_variable_to_shape_map()[embedding.tensor_name][0]
        lines = (folder / embedding.metadata_path).read_text(encoding="utf-8").split("\n")[:-1]  # as TensorBoard splits
        if task == "language_model":
            assert lines[0] == "piece\tcount" and len(lines) == rows + 1
            assert [line.split("\t")[0] for line in lines[1:3]] == ["<pad>", "<|endoftext|>"]
            vocabulary = json.loads((run_dir / "vocab.json").read_text(encoding="utf-8"))
        else:
            side = embedding.metadata_path.removeprefix("projector-").removesuffix(".tsv")  # tokens, source, target
            name = "vocab.txt" if side == "tokens" else f"vocab-{side}.txt"
            vocabulary = (run_dir / name).read_text(encoding="utf-8").splitlines()
            assert lines == [cell(piece) for piece in vocabulary]  # in id order, a line a row, no header
        assert rows == len(vocabulary)


def trained(run_dir, step=4):
    """The trained weights and the weight average's sums in a run's checkpoint of `step`."""
    reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", f"ckpt-{step}"))
    # The trainable weights sit in the checkpoint under the optimizer's list of them.
    prefixes = ("optimizer/_trainable_variables/", "weight_average/")
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name.startswith(prefixes)}


def differences(a, b):
    """(root mean square, largest) absolute difference over all tensors of two runs."""
    assert a.keys() == b.keys() and any(k.startswith("weight_average/sums/") for k in a)
    d = np.concatenate([(np.asarray(a[k], np.float64) - b[k]).ravel() for k in sorted(a)])
    return float(np.sqrt(np.mean(d**2))), float(np.max(np.abs(d)))


@pytest.fixture(scope="module")
def configs(tmp_path_factory, spam_rows, tiny_ner, tiny_translation):
    """The tiny config of each task."""
    return {
        "classification": write_tiny(tmp_path_factory.mktemp("classification"), spam_rows) / "tiny.toml",
        "ner": tiny_ner / "tiny.toml",
        "translation": tiny_translation / "tiny.toml",
        "language_model": write_tiny_corpus(tmp_path_factory.mktemp("language_model")) / "tiny.toml",
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, configs):
    """`runs(strategy, jit, task)`: the cell's (run folder, seconds, output), trained on
    first use. One-device cells train in this process. The others are `amptrain` processes
    started in the background as soon as their task's vocabulary exists, two CPU-bound
    processes at a time (a launch counts two, its workers): tracing and XLA compiling, most
    of a tiny run, use one core, and this machine has two."""
    folder = tmp_path_factory.mktemp("matrix")
    done, background = {}, {}
    pool = ThreadPoolExecutor(max_workers=4)
    slots, gate = threading.BoundedSemaphore(2), threading.Lock()

    def overrides(task, jit):
        learned = (task, False) not in done or task == "language_model"  # its own: vocab.json, merges.txt
        vocabulary = [] if learned else [f"data.vocabulary={done[task, False][0]}/vocab.txt"]
        return SAME_RUN + DECODE.get(task, []) + [f"runtime.jit_compile={str(jit).lower()}"] + vocabulary

    def one_device(task, jit):
        if (task, jit) not in done:
            if jit:
                one_device(task, False)  # the vocabulary
            run_dir = folder / f"one_device-{task}-jit{int(jit)}"
            started = time.time()
            amptrain.fit(str(configs[task]), overrides(task, jit), run_dir=str(run_dir))
            done[task, jit] = (run_dir, time.time() - started, None)
            if not jit:
                for strategy in ("mirrored", "launch"):
                    for xla in (False, True):
                        key = (strategy, xla, task)
                        background[key] = pool.submit(in_a_process, key, overrides(task, xla))
        return done[task, jit]

    def in_a_process(key, sets):
        strategy, jit, task = key
        run_dir = folder / f"{strategy}-{task}-jit{int(jit)}"
        scratch = folder / f"tmp-{strategy}-{task}-jit{int(jit)}"  # TMPDIR: the non-chief worker's folder
        scratch.mkdir()
        if strategy == "mirrored":
            sets = sets + ["runtime.strategy=mirrored", "runtime.cpu_replicas=2"]
            command = ["fit", str(configs[task]), "--run-dir", str(run_dir)]
        else:
            command = ["launch", "--workers", "2", str(configs[task]), "--run-dir", str(run_dir)]
        weight = 2 if strategy == "launch" else 1
        with gate:  # one taker at a time: two launches never hold a slot each and wait
            for _ in range(weight):
                slots.acquire()
        try:
            started = time.time()
            result = amptrain_cli(command + sum((["--set", s] for s in sets), []), env={"TMPDIR": str(scratch)})
            return run_dir, time.time() - started, result, scratch
        finally:
            for _ in range(weight):
                slots.release()

    def run(strategy, jit, task):
        reference = one_device(task, jit)
        if strategy == "one_device":
            return reference
        run_dir, seconds, result, scratch = background[strategy, jit, task].result()
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        # Only the chief writes: every other worker's folder is gone.
        assert os.listdir(scratch) == []
        return run_dir, seconds, output

    run.one_device = one_device
    yield run
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("strategy, jit, task", CELLS, ids=[f"{s}-{'xla' if j else 'noxla'}-{t}" for s, j, t in CELLS])
def test_cell_fits_evaluates_predicts_and_matches_one_device(runs, strategy, jit, task, capsys):
    run_dir, seconds, output = runs(strategy, jit, task)
    records = read_metrics(run_dir / "metrics.jsonl")
    run = [r for r in records if r["kind"] == "run"][0]
    expected = {"one_device": ("one_device", 1, 1), "mirrored": ("mirrored", 2, 1), "launch": ("multi_worker", 2, 2)}
    assert (run["strategy"], run["num_replicas"], run["num_workers"]) == expected[strategy]
    assert run["jit_compile"] is jit
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(r["split"], r["step"]) for r in evals if r["split"] == "dev"] == [("dev", 2), ("dev", 4)]
    test = [r for r in evals if r["split"] == "test"][-1]
    assert records[-1] == {"kind": "end", "step": 4}
    assert {"checkpoints", "tensorboard", "metrics.jsonl", "config.toml", "train.log"} <= set(os.listdir(run_dir))
    if task == "translation":
        assert run["tokens_per_batch"] == 320  # 8 rows of 40 pieces: 4 a replica
        assert test["sentences"] == 12 and "bleu" in test and "chrf" in test
    elif strategy != "one_device":
        assert "global batch 8 (4 a replica)" in output
    # On several workers each builds only its half of every batch (`distribute/batches.py`).
    assert run["input_share"] == ([0, 2] if strategy == "launch" else None)
    if strategy == "launch":
        assert "builds part 2 of 2 of each global batch's rows" in output
        lines = output.splitlines()
        assert any(line.startswith("[worker 0] ") for line in lines) and any(
            line.startswith("[worker 1] ") for line in lines
        )
        # Both workers trained in sync: they print the same hash of their final weights.
        fingerprints = {
            line.split(" ")[1]: line.split("final weights ")[1].split()[0] for line in lines if "final weights" in line
        }
        assert set(fingerprints) == {"0]", "1]"} and len(set(fingerprints.values())) == 1, lines[-10:]

    # `amptrain eval` and `amptrain predict` on the run folder (one device, the run's XLA setting).
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir)]) == 0
    scored = json.loads(capsys.readouterr().out)
    primary = PRIMARY[task]
    assert scored["checkpoint"] == test["checkpoint"] and scored[primary] == pytest.approx(test[primary], abs=1e-6)
    assert cli.main(["predict", str(run_dir), "--text", TEXTS[task], "--json"]) == 0
    predicted = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(predicted) == 1 and predicted[0]["text"] == TEXTS[task]

    if strategy == "one_device":
        check_projector(run_dir, task)
    reference = runs.one_device(task, False if strategy == "one_device" else jit)[0]
    rms, largest = differences(trained(reference), trained(run_dir))
    with capsys.disabled():
        print(
            f"\nmatrix {strategy} {'xla' if jit else 'noxla'} {task}: fit {seconds:.1f} s, "
            f"weights against one device{' without XLA' if strategy == 'one_device' else ''}: "
            f"RMS {rms:.1e}, largest {largest:.1e}"
        )
    assert rms < BOUNDS[0] and largest < BOUNDS[1], (rms, largest)
    if task == "translation" and strategy != "one_device":
        # The chief wrote the test translations, the same as one device's.
        predictions = "predictions-test.tsv"
        assert (run_dir / predictions).read_text(encoding="utf-8") == (reference / predictions).read_text(
            encoding="utf-8"
        )
