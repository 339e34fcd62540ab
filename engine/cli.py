"""Offline scoring from the command line, on the embedded default model or a checkpoint folder.

    python -m engine.cli --text "The capital of France is Paris."
    python -m engine.cli --ids 504 3458 282 4649 314 --start 0
    python -m engine.cli --prepare          # convert the embedded model once, then exit
"""

from __future__ import annotations

import argparse
import sys
from typing import get_args

from engine.config import DEFAULT_MODEL, EngineConfig, HeadDType
from engine.loading.default_model import resolve_model_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Score text with rayscore's engine (log-probability per token).")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder or the embedded default model")
    ap.add_argument("--text", help="text to score (tokenized without special tokens)")
    ap.add_argument("--ids", type=int, nargs="+", help="token ids to score")
    ap.add_argument("--start", type=int, default=0, help="logprob_start_len N: rows N .. L-2 are scored")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--head-dtype", default="model", choices=get_args(HeadDType),
                    help="float32: the final norm's output and the LM head upcast (EngineConfig.head_dtype)")
    ap.add_argument("--prepare", action="store_true", help="only make sure the model is converted and cached")
    args = ap.parse_args(argv)
    if args.prepare:
        print(f"model ready at {resolve_model_path(args.model)}")
        return 0
    if (args.text is None) == (args.ids is None):
        ap.error("give exactly one of --text or --ids")

    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, head_dtype=args.head_dtype,
                                    kv_cache_bytes=256 * 2**20))
    ids = args.ids if args.ids is not None else engine.tokenizer.encode(args.text, add_special_tokens=False)
    if len(ids) < args.start + 2:
        print(f"need at least {args.start + 2} tokens to score from position {args.start}", file=sys.stderr)
        return 2
    out = engine.generate([ids], SamplingParams(max_tokens=0, return_logprob=True,
                                                logprob_start_len=args.start))[0]
    total = 0.0
    for value, token in out.input_token_logprobs or []:
        total += value
        print(f"{token:>7}  {engine.tokenizer.decode([token])!r:<20} {value:10.4f}")
    n = len(out.input_token_logprobs or [])
    print(f"tokens scored: {n}  sum logprob: {total:.4f}  mean: {total / n:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
