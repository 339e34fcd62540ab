"""cuda_check's hybrid section (run on request: `--section hybrid`): a Qwen3.5-shaped model, Gated DeltaNet linear
attention in three of every four layers (the hub's linear widths: 16 key heads and 32 value heads of 128, conv 4; the
full-attention layer with its output gate, 16 heads of 256 over 4 KV heads, partial rotary), 4 layers, hidden 2048,
a small vocabulary, random weights.

float32 (TF32 off), bench/device/exact.py's checks against transformers' float32 forward and generate: one step, warm
(a repeat resumes from the linear layers' state snapshots, hybrid_state_interval 64), chunked (the state carried
across chunks and steps), the varlen backend, greedy. transformers runs on the CPU: on CUDA with fla-core installed it
routes its own Qwen3.5 through fla's kernels, whose float32 dots round through TF32, so its CUDA forward is not the
float32 reference; the engine keeps the torch reference in float32 (engine/layers/gated_delta_cuda.py).
Then bfloat16 on the automatic path (fla's chunked and recurrent kernels where fla-core imports, else the torch
reference, and why): prefill tok/s (scoring every row), decode tok/s (batched greedy after short prompts), and the
rows' distance to the float32 reference (bfloat16 rounding: close, not exact)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from bench.device.exact import WEIGHT_STD, float32_cases, float32_line, reference, row_diffs

SHAPE: dict[str, Any] = dict(
    vocab_size=16384, hidden_size=2048, intermediate_size=6144, num_hidden_layers=4, num_attention_heads=16,
    num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=8192)
SMOKE: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=1024)
INTERVAL = {True: 16, False: 64}  # hybrid_state_interval (smoke, full): snapshots inside the prompts


def build(shape: dict[str, Any], folder: Path) -> Path:
    """Random Qwen3.5 checkpoint (layer_types from the config: linear, linear, linear, full) with matrices and the
    conv weight ~ N(0, WEIGHT_STD), so the rows spread; A_log, dt_bias and the norms keep transformers' init."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                                 eos_token_id=0, bos_token_id=None, pad_token_id=1))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, WEIGHT_STD)
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<eos>": 0, "<pad>": 1, "a": 2}, unk_token="a"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    return folder


def _timed(device: torch.device, fn: Any) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bf16_case(folder: Path, run: Any, prompts: list[list[int]], lps: list[torch.Tensor],
              rng: random.Random) -> dict[str, Any]:
    """bfloat16 on the automatic path: which rule runs the gated delta rule, prefill and decode speed, and the rows
    against the float32 reference."""
    from engine.config import EngineConfig
    from engine.layers.gated_delta_cuda import rule_blocker
    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    blocker = rule_blocker(run.device, torch.bfloat16)
    res: dict[str, Any] = {"rule": "fla-core (Triton)" if blocker is None else f"torch reference: {blocker}"}
    vocab = SMOKE["vocab_size"] if run.smoke else SHAPE["vocab_size"]
    eng = LLMEngine(EngineConfig(model=str(folder), device=str(run.device), dtype="bfloat16", num_kv_blocks=2048,
                                 max_num_batched_tokens=4096, enable_prefix_cache=False))
    score = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    outs = eng.generate(prompts, score)  # also the warm-up: kernels compiled (autotuned), probes done
    res["max_abs_diff_vs_fp32"] = max(row_diffs(o, lp, ids)[0] for o, lp, ids in zip(outs, lps, prompts, strict=True))
    n, length = (2, 32) if run.smoke else (8, 2048)
    batch = [[rng.randrange(2, vocab) for _ in range(length)] for _ in range(n)]
    res["prefill"] = {"prompts": n, "tokens": length,
                      "tok_s": n * length / _timed(run.device, lambda: eng.generate(batch, score))}
    n, new = (2, 4) if run.smoke else (32, 128)
    short = [[rng.randrange(2, vocab) for _ in range(16)] for _ in range(n)]
    gen = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    eng.generate(short[:1], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # decode's warm-up
    res["decode"] = {"batch": n, "new_tokens": new, "prompt_tokens": 16,  # 16-token prompts: decode dominates
                     "tok_s": n * new / _timed(run.device, lambda: eng.generate(short, gen))}
    return res


def hybrid_section(run: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    shape = SMOKE if run.smoke else SHAPE
    folder = build(shape, run.tmp / "hybrid")
    cpu = torch.device("cpu")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # on the CPU: see the docstring
    rng = random.Random(14)
    lengths = [5, 17, 40] if run.smoke else [5, 40, 130, 333]
    prompts = [[rng.randrange(2, shape["vocab_size"]) for _ in range(n)] for n in lengths]
    prompts.append(prompts[-1][:lengths[-1] // 2] + prompts[1])  # shares a prefix with the longest one
    lps = [reference(hf, ids, cpu) for ids in prompts]
    interval = INTERVAL[run.smoke]
    res: dict[str, Any] = {"layers": shape["num_hidden_layers"], "hybrid_state_interval": interval}
    res.update(float32_cases(run, folder, hf, prompts, lps, budget=16 if run.smoke else 48,
                             greedy_prompts=prompts[1:2] if run.smoke else prompts[:3], hf_device=cpu,
                             engine_args={"hybrid_state_interval": interval}))
    del hf
    res["bf16"] = bf16_case(folder, run, prompts, lps, rng)
    res["summary"] = summary(res)
    return res


def summary(r: dict[str, Any]) -> list[tuple[str, str]]:
    b = r["bf16"]
    return [(f"float32 Qwen3.5-shaped ({r['layers']} layers)", float32_line(r)),
            ("bf16 gated delta rule", b["rule"]),
            ("bf16 speed", f"prefill {b['prefill']['tok_s']:.0f} tok/s ({b['prefill']['prompts']} x "
                           f"{b['prefill']['tokens']}), decode {b['decode']['tok_s']:.0f} tok/s (batch "
                           f"{b['decode']['batch']}); rows vs float32 max |diff| {b['max_abs_diff_vs_fp32']:.2e}")]
