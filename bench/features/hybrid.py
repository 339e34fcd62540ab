"""A hybrid model's prefix cache (Qwen3.5: engine/core/state_slots.py): what a state snapshot costs and what it buys.

    python -m bench hybrid [--tokens N] [--shared 0.9] [--interval 2048] [--reps 3] [--threads 2] [--quick]

Memory: one request's linear-layer state (bytes per slot) and the snapshots' charge per cached token
(state / hybrid_state_interval), beside the attention layers' K/V per token, for the hub's shapes (Qwen3.5-9B-like
transformers defaults, built on `meta`: no weights) and the bench model. Time: a random Qwen3.5-shaped checkpoint
(hidden 512, 8 layers, 3 of 4 linear) scores a prompt sharing `--shared` of its tokens with one scored before it
(cached: it resumes from the last snapshot) and the same prompt in a fresh engine (cold); median of --reps, float32
on CPU. --interval defaults to the engine's hybrid_state_interval and --tokens to ten intervals, so 90% shared is
exactly nine snapshots' worth (a share that ends between snapshots resumes at the one before it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen3_5ForCausalLM as HFQwen3_5
from transformers import Qwen3_5TextConfig

from engine.config import EngineConfig
from engine.invariant.row_plan import machine_name
from engine.llm_engine import LLMEngine
from engine.models.qwen3_5 import Qwen3_5ForCausalLM
from protocol.sampling import SamplingParams

SCORE = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)


def _memory(cfg: Qwen3_5TextConfig, interval: int, dtype: torch.dtype) -> str:
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(cfg).to(dtype)
    slot, kv = model.state_bytes_per_slot(), model.kv_bytes_per_token()
    return (f"state {slot / 2**20:.1f} MiB per request; snapshot charge {slot / interval / 1024:.1f} KiB per cached "
            f"token (interval {interval}); attention K/V {kv / 1024:.1f} KiB per token")


def _checkpoint(folder: Path, tokens: int) -> Path:
    cfg = Qwen3_5TextConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4,
                            linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
                            max_position_embeddings=max(8192, tokens), tie_word_embeddings=True)
    torch.manual_seed(0)
    HFQwen3_5(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def _engine(path: Path, interval: int, threads: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), device="cpu", num_threads=threads, max_num_batched_tokens=2048,
                                  hybrid_state_interval=interval))


def _score(eng: LLMEngine, ids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = eng.generate([ids], SCORE)[0]
    return time.perf_counter() - t0, out.cached_tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench hybrid", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=None, help="default: ten intervals")
    ap.add_argument("--shared", type=float, default=0.9)
    ap.add_argument("--interval", type=int, default=EngineConfig.hybrid_state_interval,
                    help="hybrid_state_interval (default: the engine's)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="512 tokens, interval 128, one rep")
    a = ap.parse_args(argv)
    if a.quick:
        a.tokens, a.interval, a.reps = 512, 128, 1
    a.tokens = a.tokens or 10 * a.interval
    print("hub shapes (transformers' Qwen3.5 defaults, bfloat16):",
          _memory(Qwen3_5TextConfig(), a.interval, torch.bfloat16))
    with tempfile.TemporaryDirectory() as tmp:
        path = _checkpoint(Path(tmp) / "hybrid", a.tokens)
        print("bench model (float32):", _memory(Qwen3_5TextConfig.from_pretrained(path), a.interval, torch.float32))
        shared = int(a.tokens * a.shared)
        cold, warm, hits = [], [], []
        for rep in range(a.reps):
            gen = torch.Generator().manual_seed(rep)
            first = torch.randint(10, 8000, (a.tokens,), generator=gen).tolist()
            second = first[:shared] + torch.randint(10, 8000, (a.tokens - shared,), generator=gen).tolist()
            eng = _engine(path, a.interval, a.threads)
            _score(eng, first)
            t, cached = _score(eng, second)
            warm.append(t)
            hits.append(cached)
            cold.append(_score(_engine(path, a.interval, a.threads), second)[0])
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"{a.tokens} tokens, {shared} shared, interval {a.interval}: cold {c:.3f} s, cached {w:.3f} s "
              f"(resumed at {statistics.median(hits):.0f} tokens), cold/cached {c / w:.2f}x; median of {a.reps}, "
              f"{a.threads} threads; {machine_name()}, load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} "
              f"(1 / 5 / 15 min) at the end")


if __name__ == "__main__":
    main()
