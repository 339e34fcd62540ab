"""Batch-invariant mode on the device at hand (CUDA where present): what its start-up checks found, and whether a
short scoring request and a short greedy generation keep their bits beside 60-180-token prefills and in steps of
over 256 rows, in both modes (the default mode is the control), with each mode's time for the same requests.

    python -m bench invariant_device [--device auto] [--dtype float32 --dtype bfloat16] [--model PATH] [--layers N]

Without --model it builds a random-weight checkpoint of SmolLM2-135M's shape (no hub needed: bits and speed do
not depend on the weights' values).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.invariant.mode import plans_of
from engine.invariant.row_plan import machine_name
from engine.llm_engine import LLMEngine
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import SamplingParams

NEEDLES = {
    "score": SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0, top_logprobs_num=3),
    "greedy": SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, return_logprob=True,
                             top_logprobs_num=2),
}
BESIDE = [[], [60], [120], [180], [60, 90], [150, 170, 120], [400, 300]]


def smollm2_shaped(folder: Path, layers: int = 30) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, eos_token_id=0, bos_token_id=None, pad_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<eos>": 0, "<pad>": 1, "a": 2}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    return folder


def served(out: RequestOutput) -> str:
    return json.dumps([out.input_token_logprobs, out.input_top_logprobs, out.new_token_ids,
                       out.output_token_logprobs, out.output_top_logprobs])


def run_case(engine: LLMEngine, needle: list[int], sizes: list[int], rng: random.Random, vocab: int
             ) -> dict[str, str]:
    names = {name: f"needle-{name}-{rng.random()}" for name in NEEDLES}
    for name, params in NEEDLES.items():
        engine.add_request(names[name], needle, params)
    for n in sizes:
        params = (SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0) if rng.random() < 0.5
                  else SamplingParams(max_tokens=rng.randint(2, 10), temperature=0.0, ignore_eos=True))
        engine.add_request(f"other-{rng.random()}", [rng.randrange(vocab) for _ in range(n)], params)
    streams: dict[str, list[RequestOutput]] = {r: [] for r in names.values()}
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id in streams:
                streams[out.request_id].append(out)
    return {name: served(merge_outputs(streams[r])) for name, r in names.items()}


def mode_run(model: Path, device: str, dtype: str, invariant: bool, threads: int) -> dict:
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(model=str(model), device=device, dtype=dtype,  # type: ignore[arg-type]
                                    batch_invariant=invariant, num_threads=threads, enable_prefix_cache=False,
                                    num_kv_blocks=1024))
    start_s = time.perf_counter() - t0
    rng = random.Random(57)
    needle = [rng.randrange(engine.vocab_size) for _ in range(24)]
    run_case(engine, needle, [], rng, engine.vocab_size)  # warm-up
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = [run_case(engine, needle, sizes, rng, engine.vocab_size) for sizes in BESIDE]
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    run_s = time.perf_counter() - t0
    moved = [f"{name} beside {sizes}" for sizes, out in zip(BESIDE, outs, strict=True) for name in NEEDLES
             if out[name] != outs[0][name]]
    plans = {}
    for name, plan in plans_of(engine.model).items():
        shape = name.split(".")[-1] if "layers" in name else name
        plans.setdefault(shape, plan.sizes)
    return {"start_s": start_s, "run_s": run_s, "moved": moved, "plans": plans, "device": str(engine.device)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench invariant_device", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30, help="layers of the built checkpoint (without --model)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or smollm2_shaped(Path(tmp) / "smollm2-shaped", args.layers)
        for dtype in args.dtype or ["float32"]:
            for invariant in (True, False):
                r = mode_run(model, args.device, dtype, invariant, args.threads)
                where = machine_name(torch.device(r["device"])) if r["device"] != "cpu" else machine_name()
                mode = "invariant" if invariant else "default"
                print(f"{where} | {r['device']} {dtype} {mode}: start {r['start_s']:.1f} s, cases "
                      f"{r['run_s']:.2f} s, bits moved in: {r['moved'] or 'none'}", flush=True)
                for shape, sizes in r["plans"].items():
                    print(f"    checked row counts of {shape}: {sizes}")


if __name__ == "__main__":
    main()
