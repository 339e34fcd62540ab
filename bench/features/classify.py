"""Classify throughput: a reward model (SmolLM2 with a one-label `score` head, LlamaForSequenceClassification) on
rayscore's engine against transformers' own forward, on the same prompts, cold (prefix cache off).

    python -m bench classify [--prompts 32] [--tokens 128] [--threads 2] [--reps 3]

transformers runs each prompt alone (no padding: its pooled position is then the last token, as the engine's);
the engine takes them as one batch. Best of --reps after a warm-up; the engine's values are checked against
transformers' within 1e-4 on the way.
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
from protocol.sampling import PoolingParams, SamplingParams


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench classify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForSequenceClassification

    prompts = [[(i * 7919 + j * 104729) % 40000 + 100 for j in range(a.tokens)] for i in range(a.prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        hf = AutoModelForSequenceClassification.from_pretrained(str(resolve_model_path(a.model, None)), num_labels=1,
                                                                dtype=torch.float32).eval()
        hf.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            src = resolve_model_path(a.model, None) / name
            if src.is_file():
                (Path(tmp) / name).write_bytes(src.read_bytes())
        eng = LLMEngine(EngineConfig(model=tmp, device="cpu", num_threads=a.threads, enable_prefix_cache=False,
                                     max_num_batched_tokens=2048, max_num_seqs=64))
        params = SamplingParams(max_tokens=0, pooling=PoolingParams())
        got = eng.generate(prompts, params)
        with torch.inference_mode():
            want = [hf(torch.tensor([p])).logits[0].tolist() for p in prompts]
        diff = max(abs(g - w) for out, row in zip(got, want, strict=True)
                   for g, w in zip(out.pooled or [], row, strict=True))
        ours, theirs = float("inf"), float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            eng.generate(prompts, params)
            ours = min(ours, time.perf_counter() - t0)
            t0 = time.perf_counter()
            with torch.inference_mode():
                for p in prompts:
                    hf(torch.tensor([p]))
            theirs = min(theirs, time.perf_counter() - t0)
    print(f"{a.prompts} prompts x {a.tokens} tokens, {a.threads} threads, best of {a.reps}; max |diff| vs "
          f"transformers {diff:.2e}")
    print(f"rayscore {a.prompts / ours:.1f} prompts/s ({ours:.2f} s) | transformers {a.prompts / theirs:.1f} "
          f"prompts/s ({theirs:.2f} s) | ratio {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
