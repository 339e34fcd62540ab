"""Which tensor_parallel_size x pipeline_parallel_size a model fits, from its config alone:

    python -m deploy.plan <checkpoint folder or config.json> [--gpu-mem 80] [--gpus-per-node 8] [--max-gpus 64]
                          [--dtype served] [--reserve-gib 6] [--utilization 0.92] [--max-seqs 256]
                          [--min-kv-tokens 32768]

For each split (TP within one node: 1, 2, 4, 8 up to --gpus-per-node, dividing the attention heads; PP: 1, 2, 4,
8, 16 stages) it prints the weights on the fullest rank and the KV tokens one replica holds: each rank's memory
(--gpu-mem GiB x --utilization, less --reserve-gib for activations, the CUDA context and the scoring chunk, and
less the linear-attention state of --max-seqs sequences on hybrid models) after its weights, divided by the bytes
it caches per token; a replica holds as many tokens as its tightest rank. A split fits when that is at least
--min-kv-tokens. The fitting split of fewest GPUs, then fewest stages, is the recommendation. The arithmetic is
deploy/sizing.py's; figures in GiB (2^30 bytes)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.sizing import DTYPE_BYTES, ModelSize, model_size

GIB = 2**30


@dataclass(frozen=True)
class Split:
    tp: int
    pp: int
    weights_gib: float  # on the fullest rank
    kv_tokens: int  # one replica; < 0: the weights alone do not fit
    state_gib: float  # linear-attention state of max_seqs sequences on the fullest rank

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


def read_config(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no config.json")
    return json.loads(p.read_text())


def splits(size: ModelSize, gpu_mem_gib: float, utilization: float, reserve_gib: float, max_seqs: int,
           gpus_per_node: int, max_gpus: int) -> list[Split]:
    out = []
    usable = gpu_mem_gib * utilization * GIB - reserve_gib * GIB
    for tp in (1, 2, 4, 8, 16):
        if tp > gpus_per_node or size.heads % tp:
            continue
        for pp in (1, 2, 4, 8, 16):
            if tp * pp > max_gpus or pp > len(size.layers):
                continue
            tokens, weights, state = None, 0.0, 0.0
            for stage in range(pp):
                w = size.rank_weights(tp, pp, stage)
                s = size.rank_state_per_seq(tp, pp, stage) * max_seqs
                kv = size.rank_kv_per_token(tp, pp, stage)
                free = usable - w - s
                t = int(free // kv) if kv and free > 0 else (-1 if free <= 0 else 10**12)
                tokens = t if tokens is None else min(tokens, t)
                weights, state = max(weights, w), max(state, s)
            out.append(Split(tp, pp, weights / GIB, tokens if tokens is not None else -1, state / GIB))
    return out


def recommend(found: list[Split], min_tokens: int) -> Split | None:
    fits = [s for s in found if s.kv_tokens >= min_tokens]
    # Fewest GPUs, then fewest stages (tensor parallelism inside a node, stages across nodes: vLLM's advice).
    return min(fits, key=lambda s: (s.gpus, s.pp, -s.kv_tokens)) if fits else None


def report(size: ModelSize, found: list[Split], best: Split | None, args: argparse.Namespace) -> str:
    lines = [f"{size.name}: {size.params / 1e9:.1f}B parameters, {size.weight_total / GIB:.1f} GiB of weights "
             f"({args.dtype}); {args.gpu_mem:g} GiB GPUs x {args.utilization:g}, {args.reserve_gib:g} GiB reserved "
             f"per GPU" + "".join(f"; {n}" for n in size.notes),
             "| TP | PP | GPUs | weights GiB / rank | KV tokens / replica | fits |", "|---|---|---|---|---|---|"]
    for s in sorted(found, key=lambda s: (s.gpus, s.pp)):
        tokens = f"{s.kv_tokens:,}" if s.kv_tokens >= 0 else "weights do not fit"
        state = f" (+{s.state_gib:.1f} GiB state)" if s.state_gib else ""
        mark = "yes" if s.kv_tokens >= args.min_kv_tokens else "no"
        lines.append(f"| {s.tp} | {s.pp} | {s.gpus} | {s.weights_gib:.1f}{state} | {tokens} | {mark} |")
    if best is None:
        lines.append(f"No split of at most {args.max_gpus} GPUs holds {args.min_kv_tokens:,} KV tokens.")
    else:
        nodes = -(-best.gpus // args.gpus_per_node)
        lines.append(f"Recommended: tensor_parallel_size {best.tp} x pipeline_parallel_size {best.pp} "
                     f"({best.gpus} GPUs, {nodes} node(s) of {args.gpus_per_node}): {best.kv_tokens:,} KV tokens "
                     "per replica.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m deploy.plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="checkpoint folder or its config.json")
    ap.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--max-gpus", type=int, default=64)
    ap.add_argument("--dtype", default="served", choices=["served", "stored", *DTYPE_BYTES],
                    help="of weights and cache; served: the config's dtype, as the engine holds the weights "
                         "(fp8 dequantized at load); stored: the checkpoint's own, fp8 / mxfp4 where it says")
    ap.add_argument("--utilization", type=float, default=0.92, help="share of each GPU's memory used")
    ap.add_argument("--reserve-gib", type=float, default=6.0,
                    help="per GPU: activations, CUDA context, the scoring chunk (<= 4.4 GiB, docs/design/gpu.md)")
    ap.add_argument("--max-seqs", type=int, default=256, help="sequences whose linear-attention state is held")
    ap.add_argument("--min-kv-tokens", type=int, default=32768, help="a split fits with at least this many")
    a = ap.parse_args(argv)
    size = model_size(read_config(a.model), a.dtype)
    found = splits(size, a.gpu_mem, a.utilization, a.reserve_gib, a.max_seqs, a.gpus_per_node, a.max_gpus)
    print(report(size, found, recommend(found, a.min_kv_tokens), a))


if __name__ == "__main__":
    main()
