"""A LoRA fit of each causal family exported `--format transformers`, loaded by `transformers`
itself in its own environment (`make venv-hf`; check_with_transformers.py): no warning of
missing or unexpected keys, its ids and float32 logits amptrain's within 1e-4, its greedy
continuation `amptrain predict RUN`'s; the bfloat16 export within bfloat16's rounding."""

import json
import os
import subprocess

import numpy as np
import pytest
from pretrained.test_causal import FAMILIES, folder
from pretrained.test_causal_runs import KJV, LORA_CONFIG

import amptrain
from amptrain.api import load_run

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_PYTHON = os.path.join(ROOT, ".venv-hf", "bin", "python")
CHECK = os.path.join(ROOT, "tests", "pretrained", "check_with_transformers.py")
TEXTS = ["And God said", "In the beginning 1234  x", "Café 🙂 and the light", "Let there be light"]
NEW_TOKENS = 20
# bfloat16 keeps 8 bits of a weight: the exported logits stay within this share of the largest one
BF16_BOUND = 0.05


@pytest.fixture(scope="module")
def hf_python():
    if not os.path.exists(HF_PYTHON):
        pytest.skip("no .venv-hf: `make venv-hf` makes the transformers environment")
    return HF_PYTHON


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("export-data")
    for name, size in (("train.txt", 20_000), ("dev.txt", 3_000)):
        with open(os.path.join(KJV, name), encoding="utf-8") as f:
            (path / name).write_text(f.read(size), encoding="utf-8")
    return path


def transformers_view(hf_python, export, tmp_path, new_tokens=NEW_TOKENS):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"texts": TEXTS, "max_new_tokens": new_tokens}), encoding="utf-8")
    done = subprocess.run([hf_python, CHECK, export, str(request)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_loads_the_export_with_amptrains_logits_and_greedy_text(family, data, hf_python, tmp_path):
    config = LORA_CONFIG.format(dir=data, pretrained=folder(family))
    config = config.replace("steps = 30", "steps = 6").replace("every = 10", "every = 6")
    (tmp_path / "lora.toml").write_text(config, encoding="utf-8")
    run = str(tmp_path / "run")
    amptrain.fit(str(tmp_path / "lora.toml"), run_dir=run)
    exported = amptrain.export(run, fmt="transformers")
    assert exported["path"] == os.path.join(run, "export-transformers") and exported["format"] == "transformers"
    half = amptrain.export(run, fmt="transformers", precision="bfloat16", out=str(tmp_path / "bf16"))

    ours = [r["generated"] for r in amptrain.predict(run, TEXTS, overrides=[f"generate.max_new_tokens={NEW_TOKENS}"])]
    task, model, _, _ = load_run(run, ())
    theirs = transformers_view(hf_python, exported["path"], tmp_path)
    assert theirs["dtype"] == "float32"
    assert not [w for w in theirs["warnings"] if "missing" in w.lower() or "unexpected" in w.lower()], theirs
    for text, record, generated in zip(TEXTS, theirs["records"], ours):
        assert task.tokenizer.prefix + task.tokenizer.encode([text])[0].tolist() == record["ids"]
        ids = np.array([record["ids"]], np.int32)
        features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "positions": np.arange(ids.shape[1])[None]}
        logits = model(features).numpy()[0]
        assert np.abs(logits - np.array(record["logits"])).max() < 1e-4, text
        assert record["generated"] == generated, text

    rounded = transformers_view(hf_python, half["path"], tmp_path)
    assert rounded["dtype"] == "bfloat16"
    for float32, bfloat16 in zip(theirs["records"], rounded["records"]):
        exact, near = np.array(float32["logits"]), np.array(bfloat16["logits"])
        assert np.abs(near - exact).max() < BF16_BOUND * np.abs(exact).max()
