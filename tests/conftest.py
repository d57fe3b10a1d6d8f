"""Shared fixtures: a tiny slice of the bundled spam data and a tiny config."""

import csv
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPAM = os.path.join(ROOT, "data", "classify-spam")

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


def write_rows(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


@pytest.fixture(scope="session")
def spam_rows():
    with open(os.path.join(SPAM, "train.csv"), encoding="utf-8", newline="") as f:
        return list(csv.reader(f))[1:]


@pytest.fixture
def tiny(tmp_path, spam_rows):
    """A folder with 96 train and 32 dev rows of real spam data and `tiny.toml`."""
    write_rows(tmp_path / "train.csv", spam_rows[:96])
    write_rows(tmp_path / "dev.csv", spam_rows[96:128])
    (tmp_path / "tiny.toml").write_text(TINY_CONFIG.replace('"train.csv"', f'"{tmp_path}/train.csv"').replace('"dev.csv"', f'"{tmp_path}/dev.csv"'))
    return tmp_path
