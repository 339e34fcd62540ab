"""rayscore's side in-process: the engine's synchronous batch call, LLMEngine.generate."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from protocol.outputs import RequestOutput
from protocol.sampling import SamplingParams


def make_engine(model: str, threads: int, **overrides: Any) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, num_threads=threads, **overrides))




class FreshEngine:
    """A new engine before every repetition (its `prepare`), so the prefix cache never holds the previous
    repetition's prompts. Building one takes about a second and is not timed."""

    def __init__(self, make: Callable[[], LLMEngine]) -> None:
        self.make = make
        self.engine: LLMEngine | None = None

    def prepare(self) -> None:
        self.engine = None
        gc.collect()
        self.engine = self.make()

    def get(self) -> LLMEngine:
        if self.engine is None:
            self.prepare()
        assert self.engine is not None
        return self.engine

    def close(self) -> None:
        self.engine = None
        gc.collect()


def native_bf16() -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (oneDNN on AVX-512 BF16 / AMX)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_side(model: str, threads: int) -> FreshEngine | None:
    """The bfloat16 engine that workloads 2 and 4 add for information, where the CPU runs bfloat16 natively.
    Without native bfloat16 it is several times slower than float32, so they leave it out; workload 1, whose goal
    it is, always measures it."""
    return FreshEngine(lambda: make_engine(model, threads, dtype="bfloat16")) if native_bf16() else None


def score(engine: LLMEngine, prompts: list[list[int]], starts: list[int], top: int = 0) -> list[RequestOutput]:
    """All prompts submitted together, max_tokens = 0, rows from each start."""
    params = [SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=s, top_logprobs_num=top)
              for s in starts]
    return engine.generate(prompts, params)


def rows(out: RequestOutput) -> list[float]:
    return [v for v, _ in out.input_token_logprobs or []]


def argmax_rows(out: RequestOutput) -> list[int]:
    """The top-1 token of each row (needs top >= 1 in `score`)."""
    return [top[0][1] for top in out.input_top_logprobs or []]


def generate_greedy(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return [o.new_token_ids for o in engine.generate(prompts, params)]
