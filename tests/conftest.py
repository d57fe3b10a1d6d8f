"""Shared fixtures: tiny slices of the bundled spam and WNUT-17 data, and tiny configs."""

import csv
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from timing_guard import heavy_first, pytest_configure  # noqa: F401  (the slow-test guard: tests/timing_guard.py)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's CPU backend without LLVM's optimisation passes: a tiny model's compile takes a third
# to a half of its time at the default level 3, and the tests check what is compiled, when
# and with which numbers, not how fast the machine code runs (LLVM reorders no floating-point
# arithmetic without fast-math, which XLA leaves off). Set before TensorFlow starts, so the
# commands the tests start inherit it. A developer's own XLA_FLAGS are kept.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# One thread inside each op: two pytest workers and the commands they start share two cores,
# and a second intra-op thread each only made them contend (two concurrent tiny fits: 5.7 s
# each with TensorFlow's default of a thread a core, 4.2 s with one). Ops still run side by
# side (the inter-op pool is untouched: the replicas of a mirrored step need it).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
# The precision probe's cache (autoprecision/probe.py): the tests' own, never a developer's; one
# for both pytest workers of a run, so the CPU's peak per dtype (hardware/peaks.py, about 2 s
# a dtype, measured by the first fit that reports an MFU) is measured once a run, not once a
# worker. A test about the cache itself sets its own (monkeypatch.setenv).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if _RUN:
    os.environ["AMPTRAIN_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"amptrain-test-cache-{_RUN}")
    os.makedirs(os.environ["AMPTRAIN_CACHE_DIR"], exist_ok=True)
else:
    os.environ["AMPTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="amptrain-test-cache-")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPAM = os.path.join(ROOT, "data", "classify-spam")
WNUT = os.path.join(ROOT, "data", "ner-wnut17")

TINY_CONFIG = """
task = "classification"
[data]
train = "train.csv"
dev = "dev.csv"
test = "dev.csv"
vocabulary_size = 200
max_length = 32
num_buckets = 2
[model]
num_layers = 1
hidden_dim = 16
num_heads = 2
intermediate_dim = 32
dropout = 0.1
[train]
steps = 12
batch_size = 8
learning_rate = 3e-3
warmup_steps = 0
decay = "constant"
log_every = 4
checkpoint_every = 4
"""


@pytest.fixture(autouse=True)
def _quick_tests_start_no_python(request, monkeypatch):
    """`make test` runs the tests not marked slow, and those start no Python process (an
    `amptrain` command or a bench worker costs seconds of TensorFlow start-up): a test that
    does fails here, asking to be marked `slow` (`make test-all` runs it)."""
    if request.node.get_closest_marker("slow"):
        return
    real = subprocess.Popen

    class Refused(real):
        def __init__(self, args, *rest, **options):
            command = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            if command and str(command[0]) == sys.executable:
                pytest.fail(f"{request.node.nodeid} starts a Python process: mark it @pytest.mark.slow (make test-all)")
            super().__init__(args, *rest, **options)

    monkeypatch.setattr(subprocess, "Popen", Refused)


def pytest_collection_modifyitems(items):
    heavy_first(items)


def shared_run(name, run_dir, train):
    """`run_dir`: a copy of the run `train(folder)` trains into `folder`, trained once a pytest
    run for every module and both workers that ask for `name` (the first asks and trains
    under a lock; the others wait for it, then copy), so modules that check one tiny run
    from two sides (the export tests and the server tests) train it once. A copy each, so
    that what one module writes into its run (exports) is not seen by the other."""
    root = os.path.join(tempfile.gettempdir(), f"amptrain-test-runs-{_RUN or os.getpid()}")
    os.makedirs(root, exist_ok=True)
    trained, done = os.path.join(root, name), os.path.join(root, f"{name}.done")
    with open(os.path.join(root, f"{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(done):
            shutil.rmtree(trained, ignore_errors=True)  # a half-trained one left by a failure
            train(trained)
            open(done, "w").close()
    shutil.copytree(trained, run_dir)
    return run_dir


def write_rows(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


@pytest.fixture(scope="session")
def spam_rows():
    with open(os.path.join(SPAM, "train.csv"), encoding="utf-8", newline="") as f:
        return list(csv.reader(f))[1:]


def write_tiny(folder, spam_rows):
    """Writes 96 train and 32 dev rows of real spam data and `tiny.toml` (TINY_CONFIG) reading
    them into `folder`; returns it."""
    write_rows(folder / "train.csv", spam_rows[:96])
    write_rows(folder / "dev.csv", spam_rows[96:128])
    (folder / "tiny.toml").write_text(
        TINY_CONFIG.replace('"train.csv"', f'"{folder}/train.csv"').replace('"dev.csv"', f'"{folder}/dev.csv"')
    )
    return folder


@pytest.fixture
def tiny(tmp_path, spam_rows):
    """A folder with 96 train and 32 dev rows of real spam data and `tiny.toml`."""
    return write_tiny(tmp_path, spam_rows)


# The tiny spam config's model and training, on WNUT-17 sentences.
TINY_NER_CONFIG = """
task = "ner"
[data]
train = "{dir}/train.conll"
dev = "{dir}/dev.conll"
test = "{dir}/dev.conll"
vocabulary_size = 300
max_length = 64
num_buckets = 2
""" + TINY_CONFIG[TINY_CONFIG.index("[model]") :]


@pytest.fixture(scope="session")
def wnut_sentences():
    """The bundled WNUT-17 training file as a list of sentences, each a list of its lines."""
    sentences, current = [], []
    with open(os.path.join(WNUT, "train.conll"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                current.append(line.rstrip("\n"))
            elif current:
                sentences.append(current)
                current = []
    return sentences + ([current] if current else [])


def write_conll(path, sentences):
    path.write_text("".join("\n".join(lines) + "\n\n" for lines in sentences), encoding="utf-8")


@pytest.fixture(scope="module")
def tiny_ner(tmp_path_factory, wnut_sentences):
    """A folder (one a test module: its runs can be shared) with 64 train and 24 dev
    sentences of real WNUT-17 data and `tiny.toml`."""
    tmp_path = tmp_path_factory.mktemp("ner")
    write_conll(tmp_path / "train.conll", wnut_sentences[:64])
    write_conll(tmp_path / "dev.conll", wnut_sentences[64:88])
    (tmp_path / "tiny.toml").write_text(TINY_NER_CONFIG.replace("{dir}", str(tmp_path)))
    return tmp_path


EN_ES = os.path.join(ROOT, "data", "translate-en-es")

TINY_TRANSLATION_CONFIG = """
task = "translation"
[data]
train = "{dir}/train.tsv"
dev = "{dir}/dev.tsv"
test = "{dir}/test.tsv"
vocabulary_size = 300
max_length = 40
num_buckets = 2
tokens_per_batch = 320
[model]
num_layers = 1
num_decoder_layers = 1
hidden_dim = 16
num_heads = 2
intermediate_dim = 32
dropout = 0.0
[train]
steps = 8
learning_rate = 3e-3
warmup_steps = 0
decay = "constant"
label_smoothing = 0.1
log_every = 4
eval_every = 4
checkpoint_every = 4
[decode]
beam_size = 3
max_length = 12
dev_sentences = 8
batch_size = 8
"""


@pytest.fixture(scope="module")
def tiny_translation(tmp_path_factory):
    """A folder (one a test module) with 96 train, 16 dev and 12 test pairs of the bundled
    en-es data and `tiny.toml`."""
    tmp_path = tmp_path_factory.mktemp("translation")
    with open(os.path.join(EN_ES, "train.tsv"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    (tmp_path / "train.tsv").write_text("\n".join(lines[:96]) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\n".join(lines[96:112]) + "\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("\n".join(lines[112:124]) + "\n", encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY_TRANSLATION_CONFIG.replace("{dir}", str(tmp_path)))
    return tmp_path


# The tiny random BERT in the Hugging Face layout (tests/pretrained/make_reference.py made it).
TINY_BERT = os.path.join(ROOT, "tests", "pretrained", "tiny-bert")

PRETRAINED_MODEL = f"""[model]
pretrained = "{TINY_BERT}"
dropout = 0.1
"""


def pretrained_config(config):
    """A tiny config with its [model] section replaced by the tiny pretrained BERT, and the
    fine-tuning recipe's keys."""
    start, end = config.index("[model]"), config.index("[train]")
    return config[:start] + PRETRAINED_MODEL + config[end:] + "head_learning_rate = 1e-2\nlayer_decay = 0.8\n"


@pytest.fixture
def tiny_pretrained(tiny):
    """The tiny spam config (`tiny`) on the tiny pretrained BERT: `pretrained.toml`."""
    (tiny / "pretrained.toml").write_text(pretrained_config((tiny / "tiny.toml").read_text()))
    return tiny / "pretrained.toml"


def assert_only_amptrains(run_dir):
    """Every entry at the top of `run_dir` has a name amptrain owns (`run_folder.ownership`):
    the only names an --overwrite or a failed start's retry may delete."""
    from amptrain.engine.run_folder.ownership import is_own_name

    strangers = [name for name in os.listdir(run_dir) if not is_own_name(name)]
    assert not strangers, f"{run_dir} holds names run_folder.ownership does not know: {strangers}"
