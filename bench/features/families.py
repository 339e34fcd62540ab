"""The new model families at realistic shapes: rayscore against transformers on random weights.

    python -m bench families [--quick] [--shape qwen3 --shape moe] [--prompts 8] [--tokens 512] [--reps 3]

Shapes (random weights, float32, built with transformers' own classes into a temporary folder; no hub):
  qwen3  Qwen3-0.6B's (hidden 1024, 28 layers, 16 q / 8 kv heads of 128, MLP 3072, vocab 151,936, tied)
  moe    a small Qwen3-MoE (Qwen3-0.6B's attention and vocab, 8 experts of 768, top-2, 12 layers)
--quick keeps 4 layers of each (the per-layer work is the same; minutes instead of a quarter hour); --smoke
shrinks everything to check that the tool runs (figures meaningless).

Workload: `--prompts` prompts of `--tokens` random ids submitted together, every row scored (N = 0); rayscore's
synchronous batch call against transformers' one forward per request, alternating, median of --reps, one thread
count for both. Reported: scoring tokens/s of each side, their ratio, and the largest |logprob difference|.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.lib import baselines as hf_side
from bench.lib import rayscore_side as rs
from bench.lib.harness import Side, alternate, max_abs_diff_requests, set_threads

QWEN3_06B: dict[str, Any] = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3": QWEN3_06B,
    "moe": {**QWEN3_06B, "num_hidden_layers": 12, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 768, "norm_topk_prob": True, "tie_word_embeddings": False},
}

# --smoke: every shape this small.
SMOKE: dict[str, Any] = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32)


def build(shape: str, overrides: dict[str, Any], folder: Path) -> Path:
    """Random-weight checkpoint of the shape (transformers' own init) with a word-level tokenizer stub: the
    workload feeds token ids, the engine only needs a tokenizer to load."""
    from tokenizers import Tokenizer, models
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    kw = {**SHAPES[shape], **overrides}
    cls, cfg = (Qwen3MoeForCausalLM, Qwen3MoeConfig(**kw)) if shape == "moe" else (Qwen3ForCausalLM, Qwen3Config(**kw))
    torch.manual_seed(0)
    cls(cfg).save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


def measure(path: Path, prompts: list[list[int]], reps: int, threads: int) -> dict[str, float]:
    starts = [0] * len(prompts)
    tokens = sum(len(p) for p in prompts)
    hf = hf_side.load_transformers(path)
    eng = rs.FreshEngine(lambda: rs.make_engine(str(path), threads, enable_prefix_cache=False))
    sides = {"rayscore": Side(lambda: rs.score(eng.get(), prompts, starts), eng.prepare),
             "transformers": Side(lambda: hf_side.score_each(hf, prompts, starts))}
    t = alternate(sides, reps, f"{path.name} ({len(prompts)} prompts, {tokens} tokens)")
    eng.close()
    ours = [rs.rows(o) for o in t.warmup["rayscore"]]
    return {"rayscore_tok_s": t.rate("rayscore", tokens), "transformers_tok_s": t.rate("transformers", tokens),
            "max_abs_diff": max_abs_diff_requests(ours, t.warmup["transformers"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench families", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="repeat for several (default: all)")
    ap.add_argument("--quick", action="store_true", help="4 layers of each shape")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and inputs (figures meaningless)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    set_threads(a.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()
    overrides = SMOKE if a.smoke else {"num_hidden_layers": 4} if a.quick else {}
    if a.smoke:
        a.prompts, a.tokens, a.reps = 2, 32, 1
    rng = random.Random(7)
    vocab = overrides.get("vocab_size", QWEN3_06B["vocab_size"])
    prompts = [[rng.randrange(2, vocab) for _ in range(a.tokens)] for _ in range(a.prompts)]
    print(f"{a.prompts} prompts x {a.tokens} tokens, {a.threads} threads, median of {a.reps}; torch "
          f"{torch.__version__}")
    print("| shape | layers | rayscore tok/s | transformers tok/s | rayscore / transformers | max abs diff |")
    print("|---|---|---|---|---|---|")
    for shape in a.shape or list(SHAPES):
        layers = overrides.get("num_hidden_layers", SHAPES[shape]["num_hidden_layers"])
        with tempfile.TemporaryDirectory(prefix=f"rayscore-bench-{shape}-") as tmp:
            got = measure(build(shape, overrides, Path(tmp) / shape), prompts, a.reps, a.threads)
        ratio = got["rayscore_tok_s"] / got["transformers_tok_s"]
        print(f"| {shape} | {layers} | {got['rayscore_tok_s']:.0f} | "
              f"{got['transformers_tok_s']:.0f} | {ratio:.2f} | {got['max_abs_diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
