"""What a weight update costs one worker: loading and checking the new checkpoint (staged beside the serving
engine), applying it (the in-place copy and the cache flush, the only part that holds requests back), and the
extra memory (the staged copy).

    python -m bench weight_update [--threads 2]

The second checkpoint is the served model's with every weight scaled by 1.01 (same shapes, other values), written
to a temporary folder. The scoring request before and after shows the answer moved.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from workers.stats import process_memory


def run(threads: int, model: str | None) -> dict:
    from safetensors.torch import load_file, save_file

    from engine.config import DEFAULT_MODEL, EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.loading.weight_update import apply_weights, stage_weights
    from protocol.sampling import SamplingParams

    engine = LLMEngine(EngineConfig(model=model or DEFAULT_MODEL, device="cpu", num_threads=threads,
                                    kv_cache_bytes=64 << 20))
    ids = [(i * 7919) % 40000 + 100 for i in range(256)]
    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    before = engine.generate([ids], params)[0].input_token_logprobs
    with tempfile.TemporaryDirectory() as tmp:
        second = Path(tmp) / "v2"
        shutil.copytree(engine.model_path, second)
        for file in second.glob("*.safetensors"):
            save_file({k: v * 1.01 for k, v in load_file(file).items()}, file, metadata={"format": "pt"})
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM
        rss, _ = process_memory()
        t0 = time.perf_counter()
        staged = stage_weights(engine, str(second))
        t1 = time.perf_counter()
        apply_weights(engine, staged, "v2")
        t2 = time.perf_counter()
        _, peak = process_memory()
    after = engine.generate([ids], params)[0].input_token_logprobs
    moved = max(abs(a - b) for (a, _), (b, _) in zip(before, after, strict=True))
    return {"model": str(engine.model_path.name), "params_mib": round(sum(
        p.numel() * p.element_size() for p in engine.model.parameters()) / 2**20),
            "stage_s": round(t1 - t0, 2), "apply_s": round(t2 - t1, 3), "extra_peak_mib": round((peak - rss) / 2**20),
            "max_logprob_change": round(moved, 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench weight_update", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.threads, args.model)))
