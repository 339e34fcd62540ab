"""cuda_check's workload sections: what users send, on the random-weight Llama-3-8B-shaped model in bfloat16, the
engine against transformers on the same device in the same run (docs/design/gpu.md has the goals).

  ragged    1,024 prompts, lengths 16-2,048 (exponential, mean ~512), every row scored; transformers in its best
            case: prompts sorted by length, batches of at most HF_TOKENS padded tokens, log_softmax + gather
  prefill   the same lengths (other ids: no prefix-cache hit) as plain prefill, one sampled token each: scoring's
            own cost is ragged's time over this one
  mc        multiple choice: 500 contexts of 20-100 tokens x 4 endings of 5-20 (2,000 prompts of 25-120 tokens),
            the endings' rows scored, prefix cache on; transformers: sorted batches, whole prompts
  generate  batch 64 and 256, 512 prompt tokens, 128 new (greedy, EOS ignored), with and without the decode CUDA
            graphs, and transformers.generate with a static cache; decode rate = (128 - 1) new tokens per request
            over the time beyond a 1-token run
Each reports tok/s, MFU against the matmul peak measured in this run and against the spec, and peak memory (the
most allocated during the measurement, over what was allocated before). One engine and one transformers model
serve every section: built at the first, kept in Run.cache."""

from __future__ import annotations

import atexit
import random
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.device.bf16 import LLAMA3_8B, SMOKE, build, scratch

# The H100/H200 SXM dense bfloat16 spec, TFLOP/s.
SPEC_BF16_TFLOPS = 989.0
# HF_TOKENS: transformers' padded tokens a batch; its logits in bfloat16 and float32 are ~11 GiB at 8,192, which
# with two weight copies and the KV cache stays within an 80 GB card (cuda_check.PLAN).
STEP_TOKENS, MAX_SEQS, HF_TOKENS = 8192, 256, 8192
# The engine's KV cache: batch 256 x (512 + 128) tokens of the 8B shape is 20 GiB.
KV_GIB = 24


@dataclass
class Shared:
    engine: Any
    hf: Any
    shape: dict[str, Any]
    peak_flops: float
    figures: dict[str, float] = field(default_factory=dict)  # what a later section divides by


def shared(run: Any) -> Shared:
    """The engine (attention_backend auto: a varlen CUDA kernel where one serves, with CUDA graphs) and
    transformers' model, built once. The block size is the one that gets torch's flash kernel (16, else 256:
    FlashAttention 2's paged rule), else 16 for the Triton kernel (engine/runner/attention_choice.py:
    pick_block_size), so that the flash path is measured wherever it can serve; both sizes' reasons are recorded."""
    if "workloads" in run.cache:
        return run.cache["workloads"]
    from bench.lib.mfu import peak_matmul_flops
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.runner.attention_choice import pick_block_size

    shape = {**LLAMA3_8B, **SMOKE} if run.smoke else dict(LLAMA3_8B)
    shape["num_hidden_layers"] = min(run.layers_8b, shape["num_hidden_layers"])
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    block_size, kernels = pick_block_size(run.device, torch.bfloat16, head_dim, False)
    root = scratch(run.tmp, shape)
    atexit.register(shutil.rmtree, root, True)
    folder = root / "llama3-8b-shaped-workloads"
    hf = build(shape, folder, run.device)
    kv = 64 * 2**20 if run.smoke else KV_GIB * 2**30
    engine = LLMEngine(EngineConfig(model=str(folder), device=str(run.device), dtype="bfloat16",
                                    block_size=block_size, kv_cache_bytes=kv, max_num_batched_tokens=STEP_TOKENS,
                                    max_num_seqs=MAX_SEQS))
    shutil.rmtree(folder, ignore_errors=True)
    sizes = (256, 512) if run.smoke else (4096, 16384)
    peak = peak_matmul_flops(torch.bfloat16, sizes[0], sizes[1], max_seconds=1.0, reps=10, device=run.device)
    s = Shared(engine, hf, shape, peak["flops"])
    s.figures["block_size"] = block_size
    run.cache["workloads"] = s
    run.cache["workloads_setup"] = {
        "block_size": block_size, **{f"kernel_{bs}": found for bs, found in kernels.items()},
        "backend": type(engine.runner.backend).__name__, "graphs": engine.runner.graphs is not None,
        "kernel": getattr(getattr(engine.runner.backend, "kernel", None), "__name__", None),
        "score_rows": engine.runner.score_rows, "peak_bf16_tflops": peak["flops"] / 1e12, "layers": shape[
            "num_hidden_layers"]}
    return s


def measure(fn: Any, device: torch.device) -> tuple[float, float, Any]:
    """(seconds, peak GiB allocated beyond what was allocated before, fn's result)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    t = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**30 if cuda else 0.0
    return t, peak, out


def mfu(s: Shared, flops: float, seconds: float) -> dict[str, float]:
    rate = flops / seconds
    return {"mfu_measured_peak": rate / s.peak_flops, "mfu_spec": rate / (SPEC_BF16_TFLOPS * 1e12)}


def lengths(n: int, lo: int, hi: int, mean: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [min(hi, max(lo, round(rng.expovariate(1 / mean)))) for _ in range(n)]


def rand_prompts(lens: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in lens]


@torch.inference_mode()
def hf_rows(hf: Any, prompts: list[list[int]], starts: list[int], device: torch.device) -> list[list[float]]:
    """transformers' best case: sorted by length, batches of at most HF_TOKENS padded tokens, right padding; the
    rows from each prompt's start on (row p: log p(ids[p + 1]))."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[float]] = [[] for _ in prompts]
    at = 0
    while at < len(order):
        batch = [order[at]]
        while at + len(batch) < len(order) and len(prompts[order[at + len(batch)]]) * (len(batch) + 1) <= HF_TOKENS:
            batch.append(order[at + len(batch)])
        at += len(batch)
        width = max(len(prompts[i]) for i in batch)
        ids = torch.ones(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for b, i in enumerate(batch):
            ids[b, :len(prompts[i])] = torch.tensor(prompts[i])
            mask[b, :len(prompts[i])] = 1
        ids, mask = ids.to(device), mask.to(device)
        lp = torch.log_softmax(hf(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)[:, :-1]
        picked = lp.gather(2, ids[:, 1:, None])[..., 0]
        for b, i in enumerate(batch):
            out[i] = picked[b, starts[i]:len(prompts[i]) - 1].tolist()
        del lp, picked
    return out


def score_rows(engine: Any, prompts: list[list[int]], starts: list[int]) -> list[list[float]]:
    from protocol.sampling import SamplingParams

    params = [SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=n) for n in starts]
    return [[v for v, _ in o.input_token_logprobs or []] for o in engine.generate(prompts, params)]


def compare(run: Any, s: Shared, prompts: list[list[int]], starts: list[int], flops: float) -> dict[str, Any]:
    """Both sides on the same prompts, warmed up on a few others; figures of each."""
    dev = run.device
    warm = rand_prompts([len(p) for p in prompts[:8]], s.shape["vocab_size"], 99)
    score_rows(s.engine, warm, [0] * len(warm))
    hf_rows(s.hf, warm, [0] * len(warm), dev)
    tokens = sum(len(p) for p in prompts)
    res: dict[str, Any] = {"prompts": len(prompts), "tokens": tokens, "mean_len": tokens / len(prompts)}
    got = {}
    for name, fn in (("rayscore", lambda: score_rows(s.engine, prompts, starts)),
                     ("transformers", lambda: hf_rows(s.hf, prompts, starts, dev))):
        t, mem, got[name] = measure(fn, dev)
        res[name] = {"s": t, "tok_s": tokens / t, "peak_gib": mem, **mfu(s, flops, t)}
    res["ratio"] = res["rayscore"]["tok_s"] / res["transformers"]["tok_s"]
    res["max_abs_diff"] = max((abs(a - b) for x, y in zip(got["rayscore"], got["transformers"], strict=True)
                               for a, b in zip(x, y, strict=True)), default=0.0)
    return res


def ragged_section(run: Any) -> dict[str, Any]:
    from bench.lib.mfu import forward_flops

    s = shared(run)
    n = 24 if run.smoke else 1024
    lens = lengths(n, 16 if not run.smoke else 4, 2048 if not run.smoke else 64, 512 if not run.smoke else 20, 5)
    prompts = rand_prompts(lens, s.shape["vocab_size"], 6)
    flops = sum(forward_flops(s.hf, L, L - 1) for L in lens)
    res = {"setup": run.cache["workloads_setup"], **compare(run, s, prompts, [0] * n, flops)}
    s.figures["ragged_s"] = res["rayscore"]["s"]
    res["summary"] = [(f"ragged {n} prompts, mean {res['mean_len']:.0f}", line(res))]
    return res


def prefill_section(run: Any) -> dict[str, Any]:
    from protocol.sampling import SamplingParams

    s = shared(run)
    n = 24 if run.smoke else 1024
    lens = lengths(n, 16 if not run.smoke else 4, 2048 if not run.smoke else 64, 512 if not run.smoke else 20, 5)
    prompts = rand_prompts(lens, s.shape["vocab_size"], 7)  # other ids: nothing from the prefix cache
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    t, mem, _ = measure(lambda: s.engine.generate(prompts, params), run.device)
    res: dict[str, Any] = {"prompts": n, "tokens": sum(lens), "s": t, "tok_s": sum(lens) / t, "peak_gib": mem}
    if "ragged_s" in s.figures:
        res["scoring_over_prefill"] = s.figures["ragged_s"] / t
    res["summary"] = [("plain prefill, ragged lengths", f"{res['tok_s']:,.0f} tok/s; scoring every row costs "
                       f"{res.get('scoring_over_prefill', float('nan')):.2f}x the prefill; peak {mem:.2f} GiB")]
    return res


def mc_section(run: Any) -> dict[str, Any]:
    from bench.lib.mfu import forward_flops

    s = shared(run)
    rng = random.Random(8)
    contexts = 6 if run.smoke else 500
    prompts, starts = [], []
    for _ in range(contexts):
        ctx = rand_prompts([rng.randint(20, 100)], s.shape["vocab_size"], rng.randrange(1 << 30))[0]
        for _ in range(4):
            prompts.append(ctx + rand_prompts([rng.randint(5, 20)], s.shape["vocab_size"], rng.randrange(1 << 30))[0])
            starts.append(len(ctx) - 1)  # row len(ctx) - 1 scores the ending's first token
    flops = sum(forward_flops(s.hf, len(p), len(p) - st - 1) for p, st in zip(prompts, starts, strict=True))
    res = compare(run, s, prompts, starts, flops)
    res["block_size"] = s.figures["block_size"]
    res["summary"] = [(f"multiple choice {len(prompts)} prompts (x4 endings)", line(res))]
    return res


def generate_section(run: Any) -> dict[str, Any]:
    from protocol.sampling import SamplingParams

    s = shared(run)
    dev, vocab = run.device, s.shape["vocab_size"]
    plen, new = (16, 8) if run.smoke else (512, 128)
    res: dict[str, Any] = {"prompt_tokens": plen, "new_tokens": new}
    graphs = s.engine.runner.graphs
    for batch in ((4, 8) if run.smoke else (64, 256)):
        prompts = rand_prompts([plen] * batch, vocab, batch)
        r: dict[str, Any] = {}
        tokens = {}
        for mode in ("graphs", "eager"):
            if mode == "graphs" and graphs is None:
                r["graphs"] = "off (not captured: see setup)"
                continue
            s.engine.runner.graphs = graphs if mode == "graphs" else None
            one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
            full = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
            t1, _, _ = measure(lambda: s.engine.generate(prompts, one), dev)  # noqa: B023
            t, mem, outs = measure(lambda: s.engine.generate(prompts, full), dev)  # noqa: B023
            tokens[mode] = [o.new_token_ids for o in outs]
            r[mode] = {"s": t, "out_tok_s": batch * new / t, "decode_tok_s": batch * (new - 1) / max(t - t1, 1e-9),
                       "peak_gib": mem}
        s.engine.runner.graphs = graphs
        if len(tokens) == 2:
            r["graphs_equal_eager"] = sum(a == b for a, b in zip(tokens["graphs"], tokens["eager"], strict=True))
        r["transformers"] = hf_generate_figures(s, prompts, new, dev)
        res[f"batch_{batch}"] = r
    res["summary"] = [(f"generate batch {k.removeprefix('batch_')}", gen_line(v)) for k, v in res.items()
                      if k.startswith("batch_")]
    return res


def hf_generate_figures(s: Shared, prompts: list[list[int]], new: int, dev: torch.device) -> dict[str, Any]:
    """transformers' generate at this batch, when its static cache fits the memory left (else skipped, with the
    reason); warmed up untimed at the same batch first, so nothing lazy lands in the timed run."""
    from bench.device.cuda_check import memory_blocker

    cache_gib = len(prompts) * (len(prompts[0]) + new) * kv_bytes_per_token(s.shape) / 2**30
    held = torch.cuda.memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    no_memory = memory_blocker(dev, held + 1.2 * cache_gib + 2)
    if no_memory is not None:
        return {"skipped": f"its static cache ({cache_gib:.0f} GiB) beside the engine: {no_memory}"}
    try:
        hf_generate(s.hf, prompts, 2, dev)
        t, mem, _ = measure(lambda: hf_generate(s.hf, prompts, new, dev), dev)
        return {"s": t, "out_tok_s": len(prompts) * new / t, "peak_gib": mem, "static_cache_gib": cache_gib}
    except Exception as e:  # out of memory after all, say: the engine's figures stand
        torch.cuda.empty_cache() if dev.type == "cuda" else None
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def kv_bytes_per_token(shape: dict[str, Any]) -> int:
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * 2  # K and V, bfloat16


@torch.inference_mode()
def hf_generate(hf: Any, prompts: list[list[int]], new: int, device: torch.device) -> Any:
    """transformers' generate with a static cache, never compiled: on CUDA a static cache turns torch.compile on
    by default, which would put minutes of compilation into the timed baseline (once per batch size)."""
    ids = torch.tensor(prompts, device=device)
    hf.generation_config.eos_token_id = None  # the engine ignores EOS: both run every new token
    return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                       pad_token_id=1, cache_implementation="static", disable_compile=True)


def line(r: dict[str, Any]) -> str:
    a, b = r["rayscore"], r["transformers"]
    return (f"rayscore {a['tok_s']:,.0f} tok/s (MFU {100 * a['mfu_measured_peak']:.0f}% of measured, "
            f"{100 * a['mfu_spec']:.0f}% of spec; peak +{a['peak_gib']:.2f} GiB), transformers {b['tok_s']:,.0f} "
            f"tok/s (+{b['peak_gib']:.2f} GiB), ratio {r['ratio']:.2f}, max |diff| {r['max_abs_diff']:.2g}")


def gen_line(r: dict[str, Any]) -> str:
    parts = []
    for mode in ("graphs", "eager"):
        v = r.get(mode)
        parts.append(f"{mode} {v['decode_tok_s']:,.0f} decode tok/s ({v['out_tok_s']:,.0f} end to end, "
                     f"+{v['peak_gib']:.2f} GiB)" if isinstance(v, dict) else f"{mode} {v}")
    hf = r.get("transformers", {})
    parts.append(f"transformers {hf['out_tok_s']:,.0f} tok/s end to end" if "out_tok_s" in hf
                 else f"transformers {hf.get('error') or 'skipped: ' + str(hf.get('skipped'))}")
    if "graphs_equal_eager" in r:
        parts.append(f"graphs = eager tokens in {r['graphs_equal_eager']} requests")
    return "; ".join(parts)
