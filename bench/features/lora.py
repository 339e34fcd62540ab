"""What serving LoRA adapters costs: one batch of scoring requests spread over 1, 4 or 16 adapters (every adapter's
rows in the same engine steps) against the same batch on the base model alone.

    python -m bench lora [--prompts 32] [--tokens 128] [--rank 16] [--adapters 1 4 16] [--threads 2] [--reps 3]

SmolLM2 by default (the embedded model); adapters are random PEFT adapters of rank --rank on q/k/v/o and gate/up/down,
built with PEFT into a temporary folder. Prefix cache off, so every run computes every token; each figure is the
best of --reps runs after a warm-up, and the ratio is to the base model's time in the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.llm_engine import LLMEngine
from engine.loading.default_model import resolve_model_path
from protocol.sampling import AdapterRef, SamplingParams

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapters(base: Path, folder: Path, count: int, rank: int) -> dict[str, str]:
    """`count` random PEFT adapters of `base`, saved under folder; name -> path."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, lora_dropout=0.0))
    paths = {}
    for i in range(count):
        torch.manual_seed(i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.normal_(0, 0.02)
        model.save_pretrained(str(folder / f"a{i}"))
        paths[f"a{i}"] = str(folder / f"a{i}")
    return paths


def _prompts(n: int, tokens: int) -> list[list[int]]:
    return [[(i * 7919 + j * 104729) % 40000 + 100 for j in range(tokens)] for i in range(n)]


def _time(eng: LLMEngine, prompts: list[list[int]], adapters: list[str | None], reps: int) -> float:
    params = [SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0,
                             adapter=None if a is None else AdapterRef(a)) for a in adapters]
    eng.generate(prompts[:4], params[:4])  # warm-up (loads the adapters it names)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        eng.generate(prompts, params)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench lora", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    base = resolve_model_path(a.model, None)
    prompts = _prompts(a.prompts, a.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_adapters(base, Path(tmp), max(a.adapters), a.rank)
        eng = LLMEngine(EngineConfig(model=str(base), device="cpu", num_threads=a.threads, enable_prefix_cache=False,
                                     lora_adapters=paths, max_loras=max(a.adapters), max_lora_rank=a.rank,
                                     max_num_batched_tokens=2048, max_num_seqs=64))
        base_s = _time(eng, prompts, [None] * len(prompts), a.reps)
        n = a.prompts * a.tokens
        print(f"{a.prompts} scoring prompts x {a.tokens} tokens, rank {a.rank}, {a.threads} threads, best of {a.reps}")
        print(f"{'adapters':>8} | {'s':>6} | {'tokens/s':>8} | {'vs base':>7}")
        print(f"{'base':>8} | {base_s:>6.2f} | {n / base_s:>8.0f} | {1.0:>7.2f}", flush=True)
        for k in a.adapters:
            names: list[str | None] = [f"a{i % k}" for i in range(a.prompts)]
            s = _time(eng, prompts, names, a.reps)
            print(f"{k:>8} | {s:>6.2f} | {n / s:>8.0f} | {base_s / s:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
