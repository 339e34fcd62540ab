"""cuda_check's gpt-oss section: attention sinks, alternating 128-token windows, YaRN and the biased, clamped experts
on the device, against transformers' float32 eager forward (its only attention for sinks) on the same device.

A gpt-oss-20b-shaped layer (hidden 2880 would not change what is checked; the shape keeps the head layout: 64-dim
heads, GQA 8, windows of 128, YaRN factor 32 over 4096) at 4 layers and a small vocabulary, random weights. Prompts
run past several windows. Cases, all float32 (TF32 off; bench/device/exact.py's float32_cases): the torch paged
path in one step, chunked, warm from the prefix cache, greedy; the varlen backend (float32: the flash kernel has no
sinks, so our Triton kernel in IEEE mode serves it on CUDA; the reference kernel on CPU), chunked, warm and greedy.
Then bfloat16: the Triton kernel against the torch path on the same bf16 weights (close, not exact), the kernel
choice and why flash did not serve."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from bench.device.exact import float32_cases, float32_line, reference

SHAPE: dict[str, Any] = dict(vocab_size=4096, hidden_size=512, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=16, num_key_value_heads=2, head_dim=64, num_local_experts=8,
                             num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072)
SMOKE: dict[str, Any] = dict(vocab_size=512, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                             num_experts_per_tok=2, sliding_window=8, max_position_embeddings=131072)
WEIGHT_STD = 0.05


def build(shape: dict[str, Any], folder: Path) -> Path:
    """Random gpt-oss checkpoint (config defaults otherwise: YaRN factor 32 over 4096, SwiGLU limit 7) with sinks and
    router biases of unit scale, so they move the rows, and a word-level tokenizer stub."""
    from tokenizers import Tokenizer, models
    from transformers import GptOssConfig, GptOssForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = GptOssForCausalLM(GptOssConfig(**shape, rms_norm_eps=1e-5, eos_token_id=0, bos_token_id=None,
                                           pad_token_id=1, tie_word_embeddings=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "router.bias")):
                p.normal_(0, 1.0)
            elif "norm" not in name:
                p.normal_(0, WEIGHT_STD)
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<eos>": 0, "<pad>": 1, "a": 2}, unk_token="a"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    return folder


def gpt_oss_section(run: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    shape = SMOKE if run.smoke else SHAPE
    folder = build(shape, run.tmp / "gpt-oss")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(run.device).eval()
    rng = random.Random(13)
    lengths = [5, 12, 30] if run.smoke else [5, 150, 400]
    prompts = [[rng.randrange(2, shape["vocab_size"]) for _ in range(n)] for n in lengths]
    lps = [reference(hf, ids, run.device) for ids in prompts]
    res: dict[str, Any] = {"layers": shape["num_hidden_layers"], "window": shape["sliding_window"]}
    # The CPU smoke decodes one prompt (seconds); the torch path named, so the varlen engine is the other one.
    res.update(float32_cases(run, folder, hf, prompts, lps, budget=16 if run.smoke else 96,
                             greedy_prompts=prompts[1:2] if run.smoke else prompts[:2],
                             engine_args={"attention_backend": "torch"}))
    del hf
    res["bf16"] = bf16_case(dict(model=str(folder), device=str(run.device), num_kv_blocks=512), prompts)
    return res


def bf16_case(common: dict[str, Any], prompts: list[list[int]]) -> dict[str, Any]:
    """attention_backend auto in bfloat16 (on CUDA: the Triton kernel, sinks in it) against the torch path."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    auto = LLMEngine(EngineConfig(**common, dtype="bfloat16"))  # type: ignore[arg-type]
    ref = LLMEngine(EngineConfig(**common, dtype="bfloat16", attention_backend="torch"))  # type: ignore[arg-type]
    a, b = auto.generate(prompts, params), ref.generate(prompts, params)
    diff = max(abs(x - y) for oa, ob in zip(a, b, strict=True)
               for (x, _), (y, _) in zip(oa.input_token_logprobs[1:], ob.input_token_logprobs[1:], strict=True))
    gen = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ga, gb = auto.generate(prompts, gen), ref.generate(prompts, gen)
    return {"backend": type(auto.runner.backend).__name__,
            "kernel": getattr(getattr(auto.runner.backend, "kernel", None), "__name__", None),
            "max_abs_diff_vs_torch": diff,
            "greedy_equal": sum(x.new_token_ids == y.new_token_ids for x, y in zip(ga, gb, strict=True)),
            "prompts": len(prompts)}


def summary(res: dict[str, Any]) -> list[tuple[str, str]]:
    b = res["bf16"]
    return [(f"float32 ({res['layers']} layers, window {res['window']})", float32_line(res)),
            ("bfloat16 auto vs torch path", f"{b['backend']} {b['kernel']}: max |diff| {b['max_abs_diff_vs_torch']:.2e}"
             f", greedy {b['greedy_equal']}/{b['prompts']} equal")]
