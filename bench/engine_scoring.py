"""Benchmark: rayscore's engine against a plain transformers forward on the embedded SmolLM2, same run.

    python -m bench.engine_scoring [--tokens 2048] [--mem-tokens 8192] [--reps 3]

1. Scoring throughput: one prompt of --tokens tokens, N = 0, float32. Both sides alternate, median of --reps.
2. Peak extra memory for one --mem-tokens prompt: each side runs in a fresh process; the peak resident set
   is reset after the model is loaded (/proc/self/clear_refs), so the figure is what scoring itself adds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import time
from pathlib import Path

import torch


def _ids(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 49152) for _ in range(n)]


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _hf_score(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """What most people write: one full forward, log_softmax over [L, V], gather the next token."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


def _load(side: str, path: Path, kv_tokens: int):
    if side == "hf":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(path), num_kv_blocks=kv_tokens // 16 + 8,
                                  max_num_batched_tokens=kv_tokens))


def _run(side: str, obj, ids: list[int]) -> list[float]:
    if side == "hf":
        return _hf_score(obj, ids)
    from engine.sampling_params import SamplingParams

    out = obj.generate([ids], SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0))[0]
    return [v for v, _ in out.input_token_logprobs]


def _peak_child(side: str, path: str, n: int, q: mp.Queue) -> None:
    torch.set_num_threads(torch.get_num_threads())
    obj = _load(side, Path(path), n)
    ids = _ids(n, 1)
    base = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    t = time.perf_counter()
    _run(side, obj, ids)
    q.put({"extra_mb": (_rss_kb("VmHWM") - base) / 1024, "seconds": time.perf_counter() - t})


def peak_memory(side: str, path: Path, n: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_peak_child, args=(side, str(path), n, q))
    p.start()
    res = q.get()
    p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--mem-tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench/results/engine_scoring.json")
    args = ap.parse_args()
    from engine.default_model import ensure_default_model

    path = ensure_default_model()
    print(f"model {path}  threads {torch.get_num_threads()}  torch {torch.__version__}")
    hf, eng = _load("hf", path, args.tokens), _load("engine", path, args.tokens)
    ids = _ids(args.tokens)
    a, b = _run("hf", hf, ids), _run("engine", eng, ids)  # warm-up, and the answers must agree
    diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
    times: dict[str, list[float]] = {"hf": [], "engine": []}
    for r in range(args.reps):
        for side, obj in (("hf", hf), ("engine", eng)) if r % 2 == 0 else (("engine", eng), ("hf", hf)):
            t = time.perf_counter()
            _run(side, obj, ids)
            times[side].append(time.perf_counter() - t)
            print(f"  rep {r} {side:7s} {times[side][-1]:.3f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: args.tokens / v for k, v in med.items()}
    del hf, eng
    print(f"peak memory of one {args.mem_tokens}-token prompt (fresh process each) ...", flush=True)
    mem = {side: peak_memory(side, path, args.mem_tokens) for side in ("hf", "engine")}
    result = {
        "date": time.strftime("%Y-%m-%d"), "tokens": args.tokens, "reps": args.reps, "max_abs_diff": diff,
        "scoring_tokens_per_s": tps, "speed_ratio_engine_over_hf": tps["engine"] / tps["hf"],
        "mem_tokens": args.mem_tokens, "peak_extra_mb": {k: v["extra_mb"] for k, v in mem.items()},
        "memory_ratio_engine_over_hf": mem["engine"]["extra_mb"] / mem["hf"]["extra_mb"],
    }
    print(f"\n{'measure':<40}{'rayscore':>12}{'transformers':>14}{'ratio':>8}")
    print(f"{'scoring tokens/s, ' + str(args.tokens) + ' tokens, fp32':<40}{tps['engine']:>12.0f}{tps['hf']:>14.0f}"
          f"{result['speed_ratio_engine_over_hf']:>8.2f}")
    print(f"{'peak extra MB, ' + str(args.mem_tokens) + ' tokens':<40}{mem['engine']['extra_mb']:>12.0f}"
          f"{mem['hf']['extra_mb']:>14.0f}{result['memory_ratio_engine_over_hf']:>8.2f}")
    print(f"max |engine - transformers| over {args.tokens - 1} rows: {diff:.2e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
