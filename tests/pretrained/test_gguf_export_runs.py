"""A few LoRA steps of SmolLM2-135M-Instruct on the bundled chat data, exported `--format gguf`
(gguf_files/writer.py) and `--format transformers`, and loaded by `transformers` itself
(`gguf_file=` and the folder, in `make venv-hf`'s environment): the f32 file's logits the
folder's within 1e-5, both amptrain's (adapters merged) within FLOAT32_BOUND, q8_0's within
Q8_0_BOUND of the largest; the chat template and the special pieces' ids read back with the
`gguf` package. Slow, and skipped without the 135M folder (`make pretrained-llm`) or the
transformers environment."""

import json
import os

import numpy as np
import pytest
from gguf import GGUFReader
from pretrained.test_smollm2 import FOLDER
from pretrained.test_transformers_export_runs import HF_PYTHON, transformers_view

import amptrain
from amptrain.api import load_run
from amptrain.tasks.language_model.lora import merge_lora

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir(FOLDER), reason=f"no {FOLDER} (make pretrained-llm)"),
    pytest.mark.skipif(not os.path.exists(HF_PYTHON), reason="no .venv-hf (make venv-hf)"),
]
# float32 amptrain against float32 transformers on this 135M model: the starting folder itself, no
# export, differs by up to 9.8e-4 at one position of "In the beginning 1234  x" (5e-5 of the
# largest logit; the tiny models agree within 1e-4), so the export is held to the same
FLOAT32_BOUND = 2e-3
# Q8_0 keeps 8 bits a weight in blocks of 32, the tied 49,152-row embedding (the output layer) too:
# measured, the largest difference over every piece and position was 4.3, 14% of the largest logit
Q8_0_BOUND = 0.25


def chat_run(tmp_path):
    """Three LoRA steps on 24 of the bundled conversations (blocks of 128, batch 2, float32), unscored."""
    lines = open(os.path.join(ROOT, "data", "chat-en-es", "train.jsonl"), encoding="utf-8").readlines()
    (tmp_path / "train.jsonl").write_text("".join(lines[:24]), encoding="utf-8")
    overrides = [
        f"data.train={tmp_path / 'train.jsonl'}",
        "data.dev=",  # no scoring (its replies' generation would trace for half a minute): the latest checkpoint
        "data.test=",
        f"model.pretrained={FOLDER}",
        "data.max_length=128",
        "precision.policy=float32",  # the run's own logits, compared below, in float32
        "train.steps=3",
        "train.batch_size=2",
        "train.warmup_steps=0",
        "train.checkpoint_every=3",
        "train.eval_on_start=false",
        "train.lora_targets=query,value",
        "generate.max_new_tokens=8",
    ]
    run = str(tmp_path / "run")
    amptrain.fit(os.path.join(ROOT, "configs", "chat-smollm2-en-es.toml"), overrides, run_dir=run)
    return run


def test_the_gguf_export_loads_in_transformers_with_amptrains_logits(tmp_path):
    run = chat_run(tmp_path)
    exact = amptrain.export(run, fmt="gguf")
    assert exact["format"] == "gguf" and exact["path"] == os.path.join(run, "export-gguf")
    path = os.path.join(exact["path"], "run.F32.gguf")
    small = amptrain.export(run, fmt="gguf", quantize="q8_0", out=str(tmp_path / "q8"))
    small_path = os.path.join(small["path"], "run.Q8_0.gguf")
    assert os.path.getsize(small_path) < 0.3 * os.path.getsize(path)

    fields = GGUFReader(path).fields
    template = fields["tokenizer.chat_template"]
    assert bytes(template.parts[template.data[0]]).decode() == open(os.path.join(FOLDER, "chat_template.jinja")).read()
    config = json.load(open(os.path.join(FOLDER, "config.json")))
    for key in ("bos", "eos"):
        field = fields[f"tokenizer.ggml.{key}_token_id"]
        assert int(field.parts[field.data[0]][0]) == config[f"{key}_token_id"]

    folder = amptrain.export(run, fmt="transformers")["path"]
    task, model, _, _ = load_run(run, ())
    merge_lora(model)  # what the exports hold: x (W + s A B), not x W + s (x A) B
    theirs, rounded, as_folder = (transformers_view(HF_PYTHON, p, tmp_path, 1) for p in (path, small_path, folder))
    assert not [w for w in as_folder["warnings"] if "missing" in w.lower() or "unexpected" in w.lower()]
    for record, near, other in zip(theirs["records"], rounded["records"], as_folder["records"]):
        ids = np.array([record["ids"]], np.int32)
        assert other["ids"] == record["ids"]
        features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "positions": np.arange(ids.shape[1])[None]}
        logits = model(features).numpy()[0]
        assert np.abs(np.array(record["logits"]) - np.array(other["logits"])).max() < 1e-5  # the file, the folder
        assert np.abs(logits - np.array(other["logits"])).max() < FLOAT32_BOUND
        assert np.abs(np.array(near["logits"]) - logits).max() < Q8_0_BOUND * np.abs(logits).max()
