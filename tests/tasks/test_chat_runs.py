"""Chat fine-tuning end to end on the tiny Qwen2 (ChatML template), slow: `train.eval_on_start`
puts the starting model's dev and test scores at step 0, dev generates its first
`eval_generate_examples` replies and test all of them, the final test writes each reply
beside the written one, `eval --data` reads conversations, and `predict RUN --chat` prints
the reply alone."""

import json
import os

import pytest
from tasks.test_chat_task import CONVERSATIONS, TINY

import amptrain
from amptrain import api
from amptrain.cli import main
from amptrain.engine.run_log import read_metrics

pytestmark = pytest.mark.slow
CONFIG = """
task = "language_model"
[data]
train = "{data}"
dev = "{data}"
test = "{data}"
max_length = 64
[model]
pretrained = "{pretrained}"
dropout = 0.0
[precision]
policy = "float32"
[runtime]
jit_compile = false
[train]
steps = 4
batch_size = 2
learning_rate = 1e-2
warmup_steps = 0
log_every = 2
eval_every = 2
checkpoint_every = 2
eval_on_start = true
eval_generate_examples = 2
lora_rank = 4
lora_targets = "query,key,value,output,gate,up,down"
[generate]
max_new_tokens = 4
"""


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat")
    lines = [json.dumps(r, ensure_ascii=False) for r in CONVERSATIONS * 4]
    (path / "chat.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (path / "chat.toml").write_text(CONFIG.format(pretrained=TINY, data=path / "chat.jsonl"))
    run = str(path / "run")
    amptrain.fit(str(path / "chat.toml"), run_dir=run)
    return path, run


def test_eval_on_start_scores_dev_and_test_at_step_0_then_the_best_checkpoint(chat_run):
    _, run = chat_run
    evals = [r for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["kind"] == "eval"]
    first_dev, first_test = evals[0], evals[1]
    assert (first_dev["split"], first_dev["step"], first_dev["checkpoint"]) == ("dev", 0, "start")
    assert (first_test["split"], first_test["step"], first_test["checkpoint"]) == ("test", 0, "start")
    assert first_dev["replies"] == 2 and first_test["replies"] == 12  # dev's subset; test: every conversation
    for record in (first_dev, first_test):
        assert 0 <= record["chrf"] <= 100 and 0 <= record["exact_match"] <= 1 and record["reply_loss"] > 0
    assert [(r["split"], r["step"]) for r in evals[2:]] == [("dev", 2), ("dev", 4), ("test", evals[-1]["step"])]
    best = max(evals[:1] + evals[2:4], key=lambda r: r["chrf"])  # the start counts: the first of the highest
    assert evals[-1]["step"] == best["step"]


def test_the_final_test_writes_each_reply_beside_the_written_one(chat_run):
    _, run = chat_run
    with open(os.path.join(run, "predictions-test.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 12
    assert records[1]["messages"] == [{"role": "user", "content": "Translate: casa"}]
    assert records[1]["reference"] == "house" and isinstance(records[1]["reply"], str)


def test_eval_data_reads_conversations(chat_run, tmp_path):
    path, run = chat_run
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(CONVERSATIONS[1]) + "\n", encoding="utf-8")
    metrics = amptrain.evaluate(run, data=str(other))
    assert metrics["replies"] == 1 and "chrf" in metrics and metrics["tokens"] > 0


def test_predict_chat_on_the_run_prints_the_reply_alone(chat_run, capsys):
    _, run = chat_run
    (record,) = api.chat(run, ["Hola"])
    assert main(["predict", run, "--chat", "Hola"]) == 0
    assert capsys.readouterr().out == record["reply"] + "\n"
