"""head_dtype float32's cost on CPU: a bfloat16 model's LM head upcast and projected in float32
(EngineConfig.head_dtype) against its own bfloat16 head, in the same run.

    python -m bench head_dtype [--shape 49152x576 --shape 128256x2048] [--rows 1 --rows 256] [--reps 3] [--no-engine]

The head alone: the final norm + LM head of a random-weight engine LM (no layers; bench/features/score_memory.py's)
over R rows, as the engine runs them: R = 1 is a sampling row (compute_logits), R = 256 a scoring chunk
(logit_buffer.float_logits + score_rows with top-5). Per side: the seconds (median of --reps, the sides alternating),
the peak bytes the CPU allocator held beyond what was alive before (checks/cpu_peak.py) and the largest |logprob|
error at the rows' targets against the same bfloat16 weights projected in float64. Neither side keeps a float32
copy of the head: resident memory is the same (the float32 head upcasts UPCAST_ROWS vocabulary rows per call).

The engine: the embedded SmolLM2-135M in bfloat16 with each head, prefix cache off, scoring 4 prompts x 256 tokens
(every row) and decoding 4 prompts x 32 greedy tokens with logprobs; seconds per side (median, alternating).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.features.score_memory import head_model
from bench.lib.harness import set_threads
from checks.cpu_peak import peak_bytes
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.layers.linear import UPCAST_ROWS
from engine.llm_engine import LLMEngine
from engine.models.llama import LlamaForCausalLM
from engine.runner.logit_buffer import float_logits
from engine.runner.logprobs import score_rows
from protocol.sampling import SamplingParams

SIDES = ("bfloat16 head", "float32 head")
MIB = 2**20


def _run(model: LlamaForCausalLM, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The rows' target logprobs, by the engine's path for that many rows."""
    if hidden.shape[0] == 1:  # a sampling row: the sampler's logits, then log-softmax
        return torch.log_softmax(model.compute_logits(hidden).float(), -1).gather(1, targets[:, None])[:, 0]
    got = score_rows(hidden, lambda h: float_logits(model, h), targets, [5] * len(targets), "raw_logprobs",
                     hidden.shape[0])
    return torch.tensor([v for v, _ in got.values])


def _float64(model: LlamaForCausalLM, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model.model.norm(hidden).double() @ model.lm_head.weight.double().T
    return torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0].float()


def _alternate(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for r in range(reps):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


@torch.inference_mode()
def head_alone(vocab: int, hidden_size: int, rows: int, reps: int) -> dict[str, Any]:
    models = {}
    for side in SIDES:
        models[side] = head_model(vocab, hidden_size, torch.bfloat16, None)
        models[side].float32_head = side == "float32 head"
    g = torch.Generator().manual_seed(1)
    hidden = (torch.randn(rows, hidden_size, generator=g) * 2).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    truth = _float64(models[SIDES[0]], hidden, targets)
    seconds = _alternate({s: lambda m=m: _run(m, hidden, targets) for s, m in models.items()}, reps)
    out: dict[str, Any] = {"vocab": vocab, "hidden": hidden_size, "rows": rows}
    for side, model in models.items():
        out[side] = {"s": seconds[side], "peak_mib": peak_bytes(lambda m=model: _run(m, hidden, targets)) / MIB,
                     "err": (_run(model, hidden, targets) - truth).abs().max().item()}
    return out


def engine_sides(threads: int, reps: int, tokens: int = 256, new: int = 32) -> dict[str, dict[str, float]]:
    engines = {side: LLMEngine(EngineConfig(model=DEFAULT_MODEL, dtype="bfloat16", num_threads=threads,
                                            enable_prefix_cache=False,
                                            head_dtype="float32" if side == "float32 head" else "model"))
               for side in SIDES}
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, 40_000, (tokens,), generator=g).tolist() for _ in range(4)]
    scoring = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    decode = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, return_logprob=True)
    score_s = _alternate({s: lambda e=e: e.generate(prompts, scoring) for s, e in engines.items()}, reps)
    gen_s = _alternate({s: lambda e=e: e.generate([p[:16] for p in prompts], decode) for s, e in engines.items()},
                       reps)
    return {side: {"score_s": score_s[side], "gen_s": gen_s[side], "score_tok_s": 4 * tokens / score_s[side],
                   "gen_tok_s": 4 * new / gen_s[side]} for side in SIDES}


def head_table(results: list[dict[str, Any]]) -> str:
    lines = ["| vocab x hidden | rows | bf16 head s | fp32 head s | time ratio | bf16 peak MiB | fp32 peak MiB "
             "| extra MiB | bf16 head max err | fp32 head max err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, f = r[SIDES[0]], r[SIDES[1]]
        lines.append(f"| {r['vocab']} x {r['hidden']} | {r['rows']} | {b['s']:.4f} | {f['s']:.4f} | "
                     f"{f['s'] / b['s']:.2f}x | {b['peak_mib']:.1f} | {f['peak_mib']:.1f} | "
                     f"{f['peak_mib'] - b['peak_mib']:+.1f} | {b['err']:.1e} | {f['err']:.1e} |")
    return "\n".join(lines)


def engine_table(got: dict[str, dict[str, float]]) -> str:
    b, f = got[SIDES[0]], got[SIDES[1]]
    return "\n".join([
        "| SmolLM2-135M bfloat16 | bf16 head | fp32 head | ratio (fp32 / bf16 time) |", "|---|---|---|---|",
        f"| scoring 4 x 256 tokens | {b['score_s']:.2f} s ({b['score_tok_s']:.0f} tok/s) | {f['score_s']:.2f} s "
        f"({f['score_tok_s']:.0f} tok/s) | {f['score_s'] / b['score_s']:.2f}x |",
        f"| greedy 4 x 32 tokens | {b['gen_s']:.2f} s ({b['gen_tok_s']:.1f} tok/s) | {f['gen_s']:.2f} s "
        f"({f['gen_tok_s']:.1f} tok/s) | {f['gen_s'] / b['gen_s']:.2f}x |"])


def _shape(text: str) -> tuple[int, int]:
    vocab, hidden = text.lower().split("x")
    return int(vocab), int(hidden)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench head_dtype", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", type=_shape, metavar="VOCABxHIDDEN",
                    help="LM head shapes (default: SmolLM2's 49152x576 and Llama 3.2 1B's 128256x2048)")
    ap.add_argument("--rows", action="append", type=int, help="rows per call (default: 1 and 256)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per side (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-engine", action="store_true", help="the head alone, without the SmolLM2 engine runs")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check that the tool runs")
    a = ap.parse_args(argv)
    set_threads(a.threads)
    shapes = a.shape or [(49_152, 576), (128_256, 2_048)]
    rows = a.rows or [1, 256]
    if a.smoke:
        shapes, rows, a.reps, a.no_engine = [(UPCAST_ROWS + 1000, 32)], [1, 16], 1, True
    results = [head_alone(v, h, r, a.reps) for v, h in shapes for r in rows]
    print(f"head_dtype float32 vs the bfloat16 head, {a.threads} threads, median of {a.reps}")
    print(head_table(results))
    if not a.no_engine:
        print()
        print(engine_table(engine_sides(a.threads, a.reps)))
