"""cuda_check's bfloat16 section: scoring throughput and MFU of a random-weight Llama-3-8B-shaped model, the
engine against a transformers forward of the same prompts, on the device.

Workload: PROMPTS prompts of TOKENS random ids, every row scored (logprob_start_len 0, no top-k). The engine
takes them in one generate() call (GPU-sized steps: EngineConfig fields below); transformers runs batches of
HF_BATCH prompts, log_softmax of the float32 logits, gather (what a transformers user scoring text writes).
MFU = the forward's FLOPs (bench/lib/mfu.py:forward_flops, causal attention included) / measured time / the peak bf16
matmul rate measured in this run on this device. Weights are made on the device (transformers' own init, in
bfloat16) and written once as safetensors, since the engine loads a checkpoint folder."""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

LLAMA3_8B: dict[str, Any] = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                                 rms_norm_eps=1e-5, tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
SMOKE: dict[str, Any] = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
PROMPTS, TOKENS, HF_BATCH, REPS = 64, 512, 8, 2
# Engine steps sized for a GPU (the defaults, 2048 tokens and 256 rows per LM-head block, are a CPU's).
STEP_TOKENS, ROWS_PER_BLOCK = 8192, 1024
# Below this many seconds left when the section starts, the model keeps 8 of its 32 layers (per-layer work is the
# same; MFU is comparable, the LM head weighs more).
FULL_MODEL_NEEDS_S = 150


def build(shape: dict[str, Any], folder: Path, device: torch.device) -> Any:
    """The transformers model on the device in bfloat16, saved to folder (with a tokenizer stub); returns it."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = LlamaConfig(eos_token_id=0, bos_token_id=None, pad_token_id=1, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<eos>": 0, "<pad>": 1, "a": 2}, unk_token="a"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    return model


def scratch(tmp: Path, shape: dict[str, Any]) -> Path:
    """Where the checkpoint is written: /dev/shm (memory) when it has room for it and then some, else tmp; the
    write and the engine's read then cost a copy, not the disk's speed (an unknown machine's)."""
    h, v, i = shape["hidden_size"], shape["vocab_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * h // shape["num_attention_heads"]
    weight_bytes = 2 * (2 * v * h + shape["num_hidden_layers"] * (2 * h * h + 2 * h * kv + 3 * h * i))
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > weight_bytes + 8 * 2**30:
        return Path(tempfile.mkdtemp(prefix="rayscore-cuda-check-", dir=shm))
    return tmp


@torch.inference_mode()
def hf_score(hf: Any, prompts: list[list[int]], device: torch.device, batch: int) -> list[list[float]]:
    rows: list[list[float]] = []
    for lo in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[lo:lo + batch], device=device)  # equal lengths: no padding
        lp = torch.log_softmax(hf(ids).logits.float(), dim=-1)[:, :-1]
        rows += lp.gather(2, ids[:, 1:, None])[..., 0].tolist()
    return rows


def timed(fn: Any, device: torch.device) -> tuple[float, Any]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, out


def bf16_section(run: Any) -> dict[str, Any]:
    from bench.lib.mfu import forward_flops, peak_matmul_flops
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    dev = run.device
    shape = {**LLAMA3_8B, **SMOKE} if run.smoke else dict(LLAMA3_8B)
    n_prompts, n_tokens, batch = (4, 32, 2) if run.smoke else (PROMPTS, TOKENS, HF_BATCH)
    layers = min(run.layers_8b, shape["num_hidden_layers"])
    if not run.smoke and run.left() < FULL_MODEL_NEEDS_S:
        layers = min(layers, 8)
    shape["num_hidden_layers"] = layers
    res: dict[str, Any] = {"layers": layers, "of_layers": LLAMA3_8B["num_hidden_layers"], "prompts": n_prompts,
                           "tokens_per_prompt": n_tokens, "step_tokens": STEP_TOKENS,
                           "rows_per_block": ROWS_PER_BLOCK, "hf_batch": batch}
    root = scratch(run.tmp, shape)
    folder = root / "llama3-8b-shaped"
    res["folder"] = str(folder)
    blocks = n_prompts * (n_tokens // 16 + 2) + 64
    cfg = EngineConfig(model=str(folder), device=str(dev), dtype="bfloat16", num_kv_blocks=blocks,
                       max_num_batched_tokens=STEP_TOKENS, max_num_seqs=max(64, n_prompts),
                       score_rows_per_block=ROWS_PER_BLOCK, enable_prefix_cache=False)
    try:
        res["build_save_s"], hf = timed(lambda: build(shape, folder, dev), dev)
        res["weights_gib"] = sum(p.numel() for p in hf.parameters()) * 2 / 2**30
        print(f"  built + saved {layers}-layer model ({res['weights_gib']:.1f} GiB) in {res['build_save_s']:.1f} s",
              flush=True)
        res["engine_load_s"], engine = timed(lambda: LLMEngine(cfg), dev)
    finally:  # the engine holds what it needs: the checkpoint (in memory when in /dev/shm) goes now
        shutil.rmtree(root if root != run.tmp else folder, ignore_errors=True)
    print(f"  engine loaded in {res['engine_load_s']:.1f} s", flush=True)
    rng = random.Random(3)
    prompts = [[rng.randrange(2, shape["vocab_size"]) for _ in range(n_tokens)] for _ in range(n_prompts)]
    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)

    def ours() -> list[list[float]]:
        return [[v for v, _ in o.input_token_logprobs or []] for o in engine.generate(prompts, params)]

    def theirs() -> list[list[float]]:
        return hf_score(hf, prompts, dev, batch)

    # Warm-up of each side on a slice (kernels, cuBLAS handles, allocator), then alternating timed repetitions.
    engine.generate(prompts[:batch], params)
    hf_score(hf, prompts[:batch], dev, batch)
    times: dict[str, list[float]] = {"rayscore": [], "transformers": []}
    got: dict[str, list[list[float]]] = {}
    for _ in range(REPS):
        for name, fn in (("rayscore", ours), ("transformers", theirs)):
            t, got[name] = timed(fn, dev)
            times[name].append(t)
    total = n_prompts * n_tokens
    flops = n_prompts * forward_flops(hf, n_tokens, n_tokens - 1)
    sizes = (256, 512) if run.smoke else (4096, 16384)
    peak = peak_matmul_flops(torch.bfloat16, sizes[0], sizes[1], max_seconds=1.0, reps=10, device=dev)
    res.update(peak_bf16_tflops=peak["flops"] / 1e12, peak_shape=peak["shape"], forward_tflop=flops / 1e12,
               times_s=times, max_abs_diff=max(max(abs(a - b) for a, b in zip(x, y, strict=True))
                                               for x, y in zip(got["rayscore"], got["transformers"], strict=True)))
    for name, ts in times.items():
        t = statistics.median(ts)
        res[f"{name}_tok_s"] = total / t
        res[f"{name}_mfu"] = flops / t / peak["flops"]
    if dev.type == "cuda":
        res["max_memory_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    print(f"  {summary_line(res)}", flush=True)
    return res


def summary_line(r: dict[str, Any]) -> str:
    return (f"rayscore {r['rayscore_tok_s']:,.0f} tok/s (MFU {100 * r['rayscore_mfu']:.1f}%), transformers "
            f"{r['transformers_tok_s']:,.0f} tok/s (MFU {100 * r['transformers_mfu']:.1f}%), ratio "
            f"{r['rayscore_tok_s'] / r['transformers_tok_s']:.2f}; peak bf16 {r['peak_bf16_tflops']:.0f} TFLOP/s")


def summary(r: dict[str, Any]) -> list[tuple[str, str]]:
    shape = f"Llama-3-8B-shaped, {r['layers']}/{r['of_layers']} layers, {r['prompts']}x{r['tokens_per_prompt']}"
    return [(shape, summary_line(r)),
            ("setup", f"build+save {r['build_save_s']:.1f} s ({r['weights_gib']:.1f} GiB), engine load "
                      f"{r['engine_load_s']:.1f} s; bf16 max |rayscore - transformers| {r['max_abs_diff']:.2g}")]
