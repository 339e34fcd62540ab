"""cuda_check's exactness section: the engine in float32 on the device against a plain transformers float32
forward (and generate) on the same device, TF32 off. Random weights, built here with transformers' own classes.

Scoring rows (logprob_start_len 0, top-5) of prompts of several lengths, served three ways: all in one step,
chunked prefill under a small step budget, and a warm repeat whose blocks (and hidden states) come from the
prefix cache. Greedy generation of 32 tokens against transformers' generate. float32_cases is that loop, which the
model sections (gpt_oss, mla, hybrid) run on their own checkpoints too."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

TOLERANCE = 1e-4
TOP_K = 5
NEW_TOKENS = 32

# SmolLM2-135M's shape (the embedded model's), and a tiny Qwen2 (q/k/v biases).
SMOLLM2: dict[str, Any] = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                               tie_word_embeddings=True)
QWEN2_TINY: dict[str, Any] = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                  tie_word_embeddings=False)
SMOKE: dict[str, Any] = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
# Weights ~ N(0, 0.05) rather than transformers' 0.02, so logits spread (a near-uniform row would hide errors).
WEIGHT_STD = 0.05


def build(family: str, shape: dict[str, Any], folder: Path) -> Path:
    """Random-weight checkpoint of the family and shape with a word-level tokenizer stub (the section feeds ids)."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    common = dict(rms_norm_eps=1e-5, eos_token_id=0, bos_token_id=None, pad_token_id=1, **shape)
    torch.manual_seed(0)
    if family == "llama":
        model: Any = LlamaForCausalLM(LlamaConfig(**common, rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 100000.0}))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_parameters={"rope_type": "default",
                                                                       "rope_theta": 1000000.0}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, WEIGHT_STD)
            elif family == "qwen2":  # norms stay 1; the q/k/v biases get values
                p.add_(torch.randn_like(p) * WEIGHT_STD)
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<eos>": 0, "<pad>": 1, "a": 2}, unk_token="a"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    return folder


@torch.inference_mode()
def reference(hf: Any, ids: list[int], device: torch.device) -> torch.Tensor:
    """transformers' single forward: [L, V] float32 log-softmax."""
    logits = hf(torch.tensor([ids], device=device)).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def row_diffs(out: Any, lp: torch.Tensor, ids: list[int]) -> tuple[float, float, int]:
    """(max |row - ref|, max |top value - ref at that token|, top-k sets that differ) for one scored prompt."""
    rows = out.input_token_logprobs or []
    assert len(rows) == len(ids) - 1, f"{len(rows)} rows for {len(ids)} tokens"
    ref = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:], device=lp.device)].tolist()
    d_rows = max(abs(v - r) for (v, _), r in zip(rows, ref, strict=True))
    d_top, moved = 0.0, 0
    ref_top = torch.topk(lp[:-1], TOP_K, dim=-1).indices.tolist()
    lp_cpu = lp.cpu()
    for p, top in enumerate(out.input_top_logprobs or []):
        d_top = max([d_top] + [abs(v - lp_cpu[p, t].item()) for v, t in top])
        moved += {t for _, t in top} != set(ref_top[p])
    return d_rows, d_top, moved


def score_case(engine: Any, prompts: list[list[int]], lps: list[torch.Tensor]) -> dict[str, Any]:
    from protocol.sampling import SamplingParams

    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0, top_logprobs_num=TOP_K)
    outs = engine.generate(prompts, params)
    got = [row_diffs(o, lp, ids) for o, lp, ids in zip(outs, lps, prompts, strict=True)]
    return {"max_abs_diff": max(g[0] for g in got), "top_max_abs_diff": max(g[1] for g in got),
            "top_sets_moved": sum(g[2] for g in got), "cached_tokens": sum(o.cached_tokens for o in outs),
            "rows": sum(len(p) - 1 for p in prompts)}


TEACHER_T, TEACHER_IDS = 0.7, [2, 3, 4]


def teacher_case(engine: Any, prompts: list[list[int]], lps: list[torch.Tensor]) -> dict[str, Any]:
    """A distillation teacher's request (input_logprob_temperature 0.7, top-5, token_ids_logprob) against
    log_softmax(logits / T): the rows, the top-k values and the asked ids' values; run twice (cold, then warm)."""
    from protocol.sampling import SamplingParams

    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0, top_logprobs_num=TOP_K,
                            input_logprob_temperature=TEACHER_T, token_ids_logprob=TEACHER_IDS)
    # lps are temperature-1 log-softmax rows; log_softmax(z / T) = log_softmax(log_softmax(z) / T) exactly in math.
    scaled = [torch.log_softmax(lp / TEACHER_T, dim=-1) for lp in lps]
    worst, moved = 0.0, 0
    for _ in range(2):
        outs = engine.generate(prompts, params)
        for out, lp, ids in zip(outs, scaled, prompts, strict=True):
            d_rows, d_top, m = row_diffs(out, lp, ids)
            lp_cpu = lp.cpu()
            d_ids = max(abs(v - lp_cpu[p, t].item()) for p, row in enumerate(out.input_token_ids_logprobs or [])
                        for v, t in row)
            worst, moved = max(worst, d_rows, d_top, d_ids), moved + m
    return {"max_abs_diff": worst, "top_sets_moved": moved, "temperature": TEACHER_T}


@torch.inference_mode()
def greedy_case(engine: Any, hf: Any, prompts: list[list[int]], device: torch.device) -> dict[str, Any]:
    from protocol.sampling import SamplingParams

    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    # No EOS: the engine ignores it, so transformers must run the full 32 tokens too.
    hf.generation_config.eos_token_id = None
    equal, first_diff = 0, []
    for out, ids in zip(outs, prompts, strict=True):
        g = hf.generate(torch.tensor([ids], device=device), max_new_tokens=NEW_TOKENS, do_sample=False,
                        pad_token_id=1, output_scores=True, return_dict_in_generate=True)
        ref = g.sequences[0, len(ids):].tolist()
        if out.new_token_ids == ref:
            equal += 1
            continue
        i = next((j for j, (a, b) in enumerate(zip(out.new_token_ids, ref, strict=False)) if a != b),
                 min(len(ref), len(out.new_token_ids)))
        gap = None
        if i < len(g.scores):  # a near-tie at the first difference says rounding, not a bug
            top2 = torch.topk(g.scores[i][0].float(), 2).values.tolist()
            gap = top2[0] - top2[1]
        first_diff.append({"position": i, "engine": out.new_token_ids[i:i + 3], "transformers": ref[i:i + 3],
                           "top2_gap": gap, "lengths": [len(out.new_token_ids), len(ref)]})
    return {"equal": equal, "prompts": len(prompts), "differences": first_diff}


def float32_cases(run: Any, folder: Path, hf: Any, prompts: list[list[int]], lps: list[torch.Tensor], *,
                  budget: int, greedy_prompts: list[list[int]], engine_args: dict[str, Any] | None = None,
                  hf_device: torch.device | None = None,
                  inspect: Callable[[Any, list[list[int]], list[torch.Tensor]], dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """The float32 checks every model section runs, on three engines of the checkpoint in folder: the default one
    (engine_args: e.g. attention_backend torch) in one step, warm from the prefix cache, greedy against hf's generate
    on hf_device (default the run's); the same chunked under `budget` tokens a step, no prefix cache; the varlen
    backend (one attention call per layer per step; in float32 its reference kernel or our Triton kernel, the flash
    one takes bfloat16 only) chunked, warm, greedy. inspect(engine, prompts, lps) adds the section's own figures
    from the default engine."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    common = dict(model=str(folder), device=str(run.device), dtype="float32", num_kv_blocks=512, **(engine_args or {}))
    res: dict[str, Any] = {}
    eng = LLMEngine(EngineConfig(**common))  # type: ignore[arg-type]
    res["one_step"] = score_case(eng, prompts, lps)
    res["warm_repeat"] = score_case(eng, prompts, lps)  # the same engine: blocks from the prefix cache
    res["greedy"] = greedy_case(eng, hf, greedy_prompts, hf_device or run.device)
    if inspect is not None:
        res.update(inspect(eng, prompts, lps))
    del eng
    chunked = LLMEngine(EngineConfig(**common, max_num_batched_tokens=budget,  # type: ignore[arg-type]
                                     enable_prefix_cache=False))
    res["chunked"] = score_case(chunked, prompts, lps)
    res["chunked"]["max_num_batched_tokens"] = budget
    del chunked
    var = LLMEngine(EngineConfig(**{**common, "attention_backend": "varlen"},  # type: ignore[arg-type]
                                 max_num_batched_tokens=budget))
    res["varlen"] = score_case(var, prompts, lps)
    res["varlen_warm"] = score_case(var, prompts, lps)
    res["varlen_greedy"] = greedy_case(var, hf, greedy_prompts, hf_device or run.device)
    res["varlen"]["kernel"] = getattr(var.runner.backend, "kernel", var.runner.backend).__name__
    return res


def family_case(family: str, shape: dict[str, Any], run: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    folder = build(family, shape, run.tmp / f"exact-{family}")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(run.device).eval()
    rng = random.Random(11)
    lengths = [5, 17, 40] if run.smoke else [5, 40, 130, 333]
    prompts = [[rng.randrange(2, shape["vocab_size"]) for _ in range(n)] for n in lengths]
    prompts.append(prompts[-1][:lengths[-1] // 2] + prompts[1])  # shares a prefix with the longest one
    lps = [reference(hf, ids, run.device) for ids in prompts]
    res: dict[str, Any] = {"layers": shape["num_hidden_layers"], "vocab": shape["vocab_size"]}
    res.update(float32_cases(run, folder, hf, prompts, lps, budget=16 if run.smoke else 48,
                             greedy_prompts=prompts[:3],
                             inspect=lambda eng, ps, ls: {"teacher": teacher_case(eng, ps, ls)}))
    return res


def exact_section(run: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"tolerance": TOLERANCE}
    for family, shape in (("llama", SMOLLM2), ("qwen2", QWEN2_TINY)):
        shape = {**shape, **SMOKE} if run.smoke else shape
        try:
            out[family] = family_case(family, shape, run)
        except Exception as e:  # the other family still runs
            import traceback

            traceback.print_exc()
            out[family] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(f"  {family}: {summary_line(out[family])}", flush=True)
    return out


CASES = ("one_step", "warm_repeat", "chunked", "varlen", "varlen_warm")


def float32_line(r: dict[str, Any]) -> str:
    """One line of float32_cases' results: PASS when every row and top-k value is within TOLERANCE and greedy equal."""
    worst = max(max(r[c]["max_abs_diff"], r[c]["top_max_abs_diff"]) for c in CASES)
    moved = sum(r[c]["top_sets_moved"] for c in CASES)
    greedy_ok = all(r[g]["equal"] == r[g]["prompts"] for g in ("greedy", "varlen_greedy"))
    ok = "PASS" if worst <= TOLERANCE and greedy_ok else "FAIL"
    return (f"{ok}: max |diff| {worst:.1e} (one step {r['one_step']['max_abs_diff']:.1e}, warm "
            f"{r['warm_repeat']['max_abs_diff']:.1e} with {r['warm_repeat']['cached_tokens']} cached tokens, "
            f"chunked {r['chunked']['max_abs_diff']:.1e}, varlen ({r['varlen']['kernel']}) "
            f"{max(r['varlen']['max_abs_diff'], r['varlen_warm']['max_abs_diff']):.1e}), top-{TOP_K} sets moved "
            f"{moved}, greedy {r['greedy']['equal']}/{r['greedy']['prompts']} equal (varlen "
            f"{r['varlen_greedy']['equal']}/{r['varlen_greedy']['prompts']})")


def summary_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"FAILED {r['error']}"
    line = float32_line(r)
    if r["teacher"]["max_abs_diff"] > TOLERANCE:
        line = line.replace("PASS", "FAIL", 1)
    return f"{line}; T={TEACHER_T} teacher rows + top-{TOP_K} + ids {r['teacher']['max_abs_diff']:.1e}"


def summary(res: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f"float32 {family} ({res[family].get('layers', '?')} layers)", summary_line(res[family]))
            for family in ("llama", "qwen2") if family in res]
