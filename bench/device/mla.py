"""cuda_check's MLA section: a DeepSeek-V3-shaped model (Multi-head Latent Attention with V3's head widths:
kv_lora_rank 512, qk_rope 64, qk_nope 128, v 128, q_lora_rank 1536, YaRN with mscale; group-limited routed experts
and a shared one; 4 layers, the first dense), random weights. float32 on the device against a plain transformers
forward / generate: scoring rows (top-5) in one step, warm from the prefix cache, chunked, and on the varlen backend
(the Triton kernel where it serves the 576-wide latent, else the reference); 16-token greedy. Then bfloat16
scoring throughput on the backend attention_backend=auto picks, and the latent cache's bytes per token against
the MHA cache of the same heads."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from bench.device.exact import TOLERANCE, TOP_K, WEIGHT_STD, greedy_case, reference, score_case

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
    device, budget = str(run.device), 16 if run.smoke else 48
    res: dict[str, Any] = {}
    eng = LLMEngine(EngineConfig(model=str(folder), device=device, dtype="float32", num_kv_blocks=512))
    res["one_step"] = score_case(eng, prompts, lps)
    res["warm_repeat"] = score_case(eng, prompts, lps)
    res["greedy"] = greedy_case(eng, hf, prompts[:3], run.device)
    model = eng.runner.model
    cfg = model.config
    mha = model.num_layers * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    res["latent_bytes_per_token_bf16"] = model.kv_bytes_per_token() // model.dtype.itemsize * 2
    res["mha_bytes_per_token_bf16"] = mha * 2
    del eng
    var = LLMEngine(EngineConfig(model=str(folder), device=device, dtype="float32", num_kv_blocks=512,
                                 max_num_batched_tokens=budget, attention_backend="varlen"))
    res["varlen_chunked"] = score_case(var, prompts, lps)
    res["varlen_chunked"]["kernel"] = getattr(var.runner.backend, "kernel", var.runner.backend).__name__
    res["varlen_greedy"] = greedy_case(var, hf, prompts[:3], run.device)
    del var, hf
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
    cases = ("one_step", "warm_repeat", "varlen_chunked")
    worst = max(max(r[c]["max_abs_diff"], r[c]["top_max_abs_diff"]) for c in cases)
    greedy_ok = all(r[g]["equal"] == r[g]["prompts"] for g in ("greedy", "varlen_greedy"))
    ok = "PASS" if worst <= TOLERANCE and greedy_ok else "FAIL"
    return [("float32 DeepSeek-V3-shaped MLA",
             f"{ok}: max |diff| {worst:.1e} (warm {r['warm_repeat']['cached_tokens']} cached tokens, varlen "
             f"({r['varlen_chunked']['kernel']}) {r['varlen_chunked']['max_abs_diff']:.1e}), top-{TOP_K} sets moved "
             f"{sum(r[c]['top_sets_moved'] for c in cases)}, greedy {r['greedy']['equal']}/{r['greedy']['prompts']} "
             f"(varlen {r['varlen_greedy']['equal']}/{r['varlen_greedy']['prompts']})"),
            ("bf16 scoring", f"{r['bf16_score_tok_s']:.0f} tok/s on {r['bf16_backend']}"),
            ("latent cache", f"{r['latent_bytes_per_token_bf16']} B/token (bf16) vs MHA "
                             f"{r['mha_bytes_per_token_bf16']} B/token")]
