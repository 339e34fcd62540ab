"""cuda_check's MLA section: a DeepSeek-V3-shaped model (Multi-head Latent Attention with V3's head widths:
kv_lora_rank 512, qk_rope 64, qk_nope 128, v 128, q_lora_rank 1536, YaRN with mscale; group-limited routed experts
and a shared one; 4 layers, the first dense), random weights. float32 on the device against a plain transformers
forward / generate (bench/device/exact.py's float32_cases): scoring rows (top-5) in one step, warm from the prefix
cache, chunked, and on the varlen backend (the Triton kernel where it serves the 576-wide latent, else the
reference) chunked and warm; greedy. Then bfloat16 scoring throughput on the backend attention_backend=auto
picks, and the latent cache's bytes per token against the MHA cache of the same heads."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from bench.device.exact import WEIGHT_STD, float32_cases, float32_line, reference

V3_ATTENTION: dict[str, Any] = dict(
    hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, intermediate_size=4096, moe_intermediate_size=512,
    n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2, num_hidden_layers=4,
    first_k_dense_replace=1, vocab_size=16384, max_position_embeddings=16384,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0})
SMOKE: dict[str, Any] = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=12, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
    n_group=2, topk_group=1, num_hidden_layers=3, vocab_size=512, max_position_embeddings=512,
    rope_parameters={**V3_ATTENTION["rope_parameters"], "original_max_position_embeddings": 128})


def build(shape: dict[str, Any], folder: Path) -> Path:
    from tokenizers import Tokenizer, models
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(
        **{**V3_ATTENTION, **shape}, routed_scaling_factor=2.5, rms_norm_eps=1e-6, num_mtp_layers=0,
        tie_word_embeddings=False, eos_token_id=0, bos_token_id=None, pad_token_id=1))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1.0 if name.endswith("mlp.gate.weight") else WEIGHT_STD)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<eos>": 0, "<pad>": 1, "a": 2}, unk_token="a"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    return folder


def _latent_bytes(eng: Any, prompts: list[list[int]], lps: list[torch.Tensor]) -> dict[str, Any]:
    """The latent cache's bytes per token against the MHA cache of the same heads, both in bfloat16."""
    model = eng.runner.model
    cfg = model.config
    mha = model.num_layers * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    return {"latent_bytes_per_token_bf16": model.kv_bytes_per_token() // model.dtype.itemsize * 2,
            "mha_bytes_per_token_bf16": mha * 2}


def mla_section(run: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    shape = SMOKE if run.smoke else V3_ATTENTION
    folder = build(shape, run.tmp / "mla")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(run.device).eval()
    rng = random.Random(12)
    lengths = [5, 17, 40] if run.smoke else [5, 40, 130, 333]
    vocab = shape["vocab_size"]
    prompts = [[rng.randrange(2, vocab) for _ in range(n)] for n in lengths]
    prompts.append(prompts[-1][:lengths[-1] // 2] + prompts[1])  # shares a prefix with the longest one
    lps = [reference(hf, ids, run.device) for ids in prompts]
    device = str(run.device)
    res = float32_cases(run, folder, hf, prompts, lps, budget=16 if run.smoke else 48, greedy_prompts=prompts[:3],
                        inspect=_latent_bytes)
    del hf
    n, length = (2, 32) if run.smoke else (16, 512)
    batch = [[rng.randrange(2, vocab) for _ in range(length)] for _ in range(n)]
    bf = LLMEngine(EngineConfig(model=str(folder), device=device, dtype="bfloat16", num_kv_blocks=2048,
                                max_num_batched_tokens=4096, enable_prefix_cache=False))
    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    bf.generate(batch[:1], params)  # warm-up: kernels compiled, probes done
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    bf.generate(batch, params)
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    res["bf16_score_tok_s"] = n * length / (time.perf_counter() - t0)
    res["bf16_backend"] = type(bf.runner.backend).__name__ + (
        f" ({bf.runner.backend.kernel.__name__})" if hasattr(bf.runner.backend, "kernel") else "")
    res["summary"] = summary(res)
    return res


def summary(r: dict[str, Any]) -> list[tuple[str, str]]:
    return [("float32 DeepSeek-V3-shaped MLA", float32_line(r)),
            ("bf16 scoring", f"{r['bf16_score_tok_s']:.0f} tok/s on {r['bf16_backend']}"),
            ("latent cache", f"{r['latent_bytes_per_token_bf16']} B/token (bf16) vs MHA "
                             f"{r['mha_bytes_per_token_bf16']} B/token")]
