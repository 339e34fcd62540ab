"""What the workloads share in one invocation: settings, the model folder, the prompt source, and the
transformers models (loaded once, dropped before the HTTP workload)."""

from __future__ import annotations

import gc
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from bench.lib.baselines import llamacpp_available, llamacpp_probe, load_transformers
from bench.lib.harness import Settings
from bench.lib.prompts import PromptSource


class Context:
    def __init__(self, settings: Settings) -> None:
        from transformers.utils import logging

        from engine.loading.default_model import resolve_model_path
        from engine.loading.loader import load_tokenizer

        logging.disable_progress_bar()  # transformers' "Loading weights" bars would break our progress line

        self.settings = settings
        self.model_path: Path = resolve_model_path(settings.model)  # converts the embedded model once
        self.tokenizer = load_tokenizer(self.model_path)
        self.prompts = PromptSource(self.tokenizer)
        self._hf: dict[torch.dtype, Any] = {}

    @property
    def model(self) -> str:
        """What EngineConfig.model gets: the resolved folder, so no side converts anything."""
        return str(self.model_path)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else 0

    def transformers(self, dtype: torch.dtype = torch.float32) -> Any:
        if dtype not in self._hf:
            self._hf[dtype] = load_transformers(self.model_path, dtype)
        return self._hf[dtype]

    def drop_transformers(self) -> None:
        self._hf.clear()
        gc.collect()

    def gguf(self) -> Path | None:
        """The GGUF file llama.cpp runs, when llama.cpp is on, installed, and passed its probe."""
        found, problem = self._llamacpp
        return None if problem else found

    @cached_property
    def _llamacpp(self) -> tuple[Path | None, str | None]:
        """(the embedded model's GGUF or a *.gguf inside the model folder, why llama.cpp is left out). Probed once
        per invocation, in a child process, before any workload uses it."""
        if not (self.settings.use_llamacpp and llamacpp_available()):
            return None, None
        from engine.config import DEFAULT_MODEL
        from engine.loading.default_model import gguf_path

        if self.settings.model == DEFAULT_MODEL:
            found: Path | None = gguf_path()
        else:
            found = next(iter(sorted(self.model_path.glob("*.gguf"))), None)
        return found, llamacpp_probe(found) if found is not None else None

    def llamacpp_status(self) -> str:
        if not self.settings.use_llamacpp:
            return "llama.cpp: off (--no-llamacpp)"
        if not llamacpp_available():
            return "llama.cpp: not installed (pip install llama-cpp-python to add it)"
        found, problem = self._llamacpp
        if problem:
            return f"llama.cpp: installed but left out: {problem}"
        return f"llama.cpp: {found}" if found else "llama.cpp: no GGUF file for this model"
