"""The cost of batch-invariant mode against the default kernels, on the same model in one process:
a prompt's forward pass in one chunk plus the scoring projection of every row (workload 1's shape), and a decode
step (one new token per request after a 512-token context), sides alternating, median of the repetitions.

    python -m bench invariant_cost [--lengths 512 2048] [--decode-batch 1 16] [--reps 3] [--threads 2]

Prints wall-clock and process CPU seconds per side and the invariant/default ratio (CPU time is the steadier
figure on a shared machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from engine.invariant.attention import InvariantPagedAttention
from engine.invariant.mode import set_batch_invariant
from engine.layers.attention import AttentionBackend, AttentionMetadata, TorchPagedAttention
from engine.loading.default_model import ensure_default_model
from engine.loading.loader import load_model
from engine.runner.logprobs import score_rows

DECODE_CONTEXT = 512


def _meta(starts: list[int], lens: list[int], span: int) -> AttentionMetadata:
    """Request r owns KV slots r * span ...; each computes positions start .. start + len - 1."""
    meta = AttentionMetadata(slot_mapping=torch.empty(0), starts=list(starts), lens=list(lens), context_slots=[])
    meta.context_slots = [r * span + torch.arange(s + n) for r, (s, n) in enumerate(zip(starts, lens, strict=True))]
    meta.slot_mapping = torch.cat([c[s:] for c, s in zip(meta.context_slots, starts, strict=True)])
    meta.finalize(torch.device("cpu"))
    return meta


class Case:
    """One model, its KV cache, and the two steps timed on it."""

    def __init__(self, model: torch.nn.Module, requests: int, span: int) -> None:
        self.model, self.span = model, span
        shape = (requests * span, model.num_kv_heads, model.head_dim)
        self.caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in model.model.layers]
        self.ids = torch.randint(0, model.config.vocab_size, (requests * span,), generator=torch.Generator()
                                 .manual_seed(0))

    @torch.inference_mode()
    def step(self, backend: AttentionBackend, starts: list[int], lens: list[int], invariant: bool,
             score: bool = True) -> None:
        meta = _meta(starts, lens, self.span)
        ids = torch.cat([self.ids[r * self.span + s:r * self.span + s + n] for r, (s, n) in
                         enumerate(zip(starts, lens, strict=True))])
        pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
        hidden = self.model(ids, pos, self.caches, meta, backend)
        if score:
            score_rows(hidden, self.model.compute_logits, ids, [0] * len(ids), "raw_logprobs", 256, invariant)


def _time(fn: Callable[[], None]) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def compare(label: str, model: torch.nn.Module, run: Callable[[AttentionBackend, bool], None],
            prepare: Callable[[AttentionBackend, bool], None] | None, reps: int) -> None:
    sides = {"default": (TorchPagedAttention(), False), "invariant": (InvariantPagedAttention(), True)}
    wall: dict[str, list[float]] = {n: [] for n in sides}
    cpu: dict[str, list[float]] = {n: [] for n in sides}
    for r in range(reps + 1):  # round 0 warms up
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            backend, invariant = sides[name]
            set_batch_invariant(model, invariant)
            if prepare:
                prepare(backend, invariant)
            w, c = _time(lambda backend=backend, invariant=invariant: run(backend, invariant))
            if r:
                wall[name].append(w)
                cpu[name].append(c)
    med = {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in sides}
    d, i = med["default"], med["invariant"]
    print(f"{label:34s} default {d[0]:7.3f}s wall {d[1]:7.3f}s cpu | invariant {i[0]:7.3f}s wall {i[1]:7.3f}s cpu"
          f" | ratio wall {i[0] / d[0]:.2f}x cpu {i[1] / d[1]:.2f}x", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench invariant_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--decode-batch", type=int, nargs="*", default=[1, 16])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(ensure_default_model(), "float32", torch.device("cpu"))
    for n in args.lengths:
        case = Case(model, 1, n)
        compare(f"prefill + score {n} tokens", model, lambda b, inv, c=case, n=n: c.step(b, [0], [n], inv), None,
                args.reps)
    for b in args.decode_batch:
        case = Case(model, b, DECODE_CONTEXT + 1)

        def fill(backend: AttentionBackend, inv: bool, c: Case = case, b: int = b) -> None:
            c.step(backend, [0] * b, [DECODE_CONTEXT] * b, inv, score=False)

        compare(f"decode step, batch {b}, ctx {DECODE_CONTEXT}", model,
                lambda backend, inv, c=case, b=b: c.step(backend, [DECODE_CONTEXT] * b, [1] * b, inv), fill,
                args.reps)


if __name__ == "__main__":
    main()
