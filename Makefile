# make demo: train, evaluate and report the default classifier on the bundled spam data.
# make test: the test suite. Both create .venv with Python 3.11 if it is missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"

demo: install
	$(BIN)/amptrain fit configs/classify-spam.toml
	$(BIN)/amptrain predict runs/classify-spam --text "WIN a FREE cruise, click now" \
		--text "Re: build failure on the nightly tests . I checked the logs; the failure comes from the new rules file, patch attached."
	@echo "test metrics (best checkpoint): $$(grep '"split": "test"' runs/classify-spam/metrics.jsonl | tail -1)"
	@echo "run folder: runs/classify-spam   (tensorboard --logdir runs/classify-spam/tensorboard)"

test: install-test
	$(BIN)/python -m pytest -q

clean:
	rm -rf runs .pytest_cache
