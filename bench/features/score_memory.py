"""Peak memory of one scoring chunk per logit on CPU: the engine's (engine/runner/logit_buffer.py: one float32
[rows, vocab] buffer worked in place, the rest by vocab slices) against the former form, in the same run.

    python -m bench score_memory [--vocab 128256] [--rows 256] [--hidden 512] [--dtype float32 --dtype bfloat16]

The former form is the chunk as score_rows ran it before: the LM head's model-dtype logits, their float32 copy
(a soft-cap's two temporaries before it), a temperature-scaled copy, torch's out-of-place log-softmax and a
whole-row comparison for a rank. Both run the final norm + LM head of a random-weight engine LM (no layers: they
do not touch the chunk) over the same rows, `all` with every row feature (soft-cap 30, temperature 0.7, top-5,
three token ids, the target's rank), `plain` with top-5 alone.

Peak: torch.profiler's allocation events of the CPU allocator (checks/cpu_peak.py), the most held at once
beyond what was alive before the chunk. Reported per logit (bytes / (rows x vocab)), as GB per 1,024 rows, against
score_bytes of engine/runner/score_chunks.py (the bound the CUDA chunk sizing uses), with both forms' largest |value
difference| and the seconds of a chunk (median of --reps; on CPU, where a bf16 head is slow either way).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from bench.lib.harness import set_threads
from checks.cpu_peak import peak_bytes
from engine.models.llama import LlamaForCausalLM
from engine.runner.logit_buffer import float_logits
from engine.runner.logprobs import score_rows, top_k_rows
from engine.runner.score_chunks import score_bytes

CASES = ("plain", "all")


def head_model(vocab: int, hidden: int, dtype: torch.dtype, cap: float | None) -> LlamaForCausalLM:
    """Final norm + random LM head of an engine LM with no layers."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=0,
                      num_attention_heads=4, num_key_value_heads=4)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        # The engine allocates its parameters uninitialized (a checkpoint fills them): set the final norm too.
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.normal_(0, hidden ** -0.5 * 4)
    model.final_logit_softcap = cap
    return model.to(dtype).eval()


def former_chunk(model: LlamaForCausalLM, hidden: torch.Tensor, targets: torch.Tensor, ks: list[int],
                 temps: torch.Tensor | None, ranks: bool) -> list[float]:
    """One chunk as score_rows computed it before the float32 buffer: the baseline."""
    logits = model.compute_logits(hidden).float()
    if temps is not None:
        logits = logits / temps[:, None]
    scores = F.log_softmax(logits, dim=-1)
    picked = scores.gather(1, targets[:, None])[:, 0]
    top_k_rows(scores, ks)
    if ranks:
        (scores >= picked[:, None]).sum(dim=1).tolist()
    return picked.tolist()


def engine_chunk(model: LlamaForCausalLM, hidden: torch.Tensor, targets: torch.Tensor, ks: list[int],
                 temps: torch.Tensor | None, ranks: bool) -> list[float]:
    rows = hidden.shape[0]
    got = score_rows(hidden, lambda h: float_logits(model, h), targets, ks, "raw_logprobs", rows, temps=temps,
                     token_ids=[[1, 2, 3]] * rows if ranks else None, ranks=[True] * rows if ranks else None)
    return [v for v, _ in got.values]


def _seconds(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def measure(vocab: int, rows: int, hidden: int, dtype: torch.dtype, case: str, reps: int) -> dict[str, Any]:
    full = case == "all"
    model = head_model(vocab, hidden, dtype, 30.0 if full else None)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    temps = torch.full((rows,), 0.7) if full else None
    args = (model, h, targets, [5] * rows, temps, full)
    n = rows * vocab
    old, new = former_chunk(*args), engine_chunk(*args)
    return {"dtype": str(dtype).removeprefix("torch."), "case": case,
            "former_b_per_logit": peak_bytes(lambda: former_chunk(*args)) / n,
            "engine_b_per_logit": peak_bytes(lambda: engine_chunk(*args)) / n,
            "bound_b_per_logit": score_bytes(rows, vocab) / n,
            "max_abs_diff": max(abs(a - b) for a, b in zip(old, new, strict=True)),
            "former_s": _seconds(lambda: former_chunk(*args), reps),
            "engine_s": _seconds(lambda: engine_chunk(*args), reps)}


def table(results: list[dict[str, Any]]) -> str:
    head = ("| dtype | case | former B/logit | engine B/logit | bound B/logit | engine GB / 1,024 rows | max |diff| "
            "| former s | engine s |\n|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {r['dtype']} | {r['case']} | {r['former_b_per_logit']:.2f} | {r['engine_b_per_logit']:.2f} | "
             f"{r['bound_b_per_logit']:.2f} | {r['engine_b_per_logit'] * r['vocab'] * 1024 / 1e9:.3f} | "
             f"{r['max_abs_diff']:.1e} | {r['former_s']:.3f} | {r['engine_s']:.3f} |" for r in results]
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench score_memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=128_256, help="vocabulary (default: Llama 3's)")
    ap.add_argument("--rows", type=int, default=256, help="rows of the chunk")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of the LM head")
    ap.add_argument("--dtype", action="append", choices=("float32", "bfloat16"), help="repeat for several")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check that the tool runs")
    a = ap.parse_args(argv)
    set_threads(a.threads)
    if a.smoke:
        a.vocab, a.rows, a.hidden, a.reps = 20_000, 16, 32, 1
    results = []
    for name in a.dtype or ["float32", "bfloat16"]:
        for case in CASES:
            r = measure(a.vocab, a.rows, a.hidden, getattr(torch, name), case, a.reps)
            results.append({**r, "vocab": a.vocab})
    print(f"one scoring chunk: {a.rows} rows x vocab {a.vocab}, hidden {a.hidden}, {a.threads} threads")
    print(table(results))
