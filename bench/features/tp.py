"""What tensor and pipeline parallelism cost on CPU: per-step time of the same work on N = 1, 2, 3 ranks (a size
`TxP`: tensor_parallel_size T x pipeline_parallel_size P, e.g. 1x2 for two pipeline stages of one rank), and the
bytes each rank moves per scoring row with the vocab-parallel log-softmax against gathering the logits.

    python -m bench tp [--model PATH] [--sizes 1 2 3 1x2] [--threads 1] [--prompts 8] [--tokens 256] [--decode 32]
    python -m bench tp --smoke          (tiny sizes: checks the tool runs; figures meaningless)
    python -m bench tp --moe [--sizes 1 2] (MOE_SHAPE: each TP > 1 twice, experts split by width, then whole
                                            experts per rank: expert_parallel)

Each size with P > 1 runs twice: one step at a time (pipeline_overlap false, "seq"), then with up to P steps in
flight (the default); the last columns give the peak of steps in flight and the throughput of each phase (tokens
computed per second of wall time), which is what overlap changes: it runs more, smaller steps at once.

Default model: SmolLM2-135M's shape with random weights (hidden 576, 30 layers, MLP 1536, vocab 49,152, tied) but
12 query / 6 KV heads of 48, so that 2 and 3 both divide them (the embedded SmolLM2's 9 / 3 heads take 1 and 3:
--model smollm2-135m-instruct --sizes 1 3).

Ranks are processes on this machine over gloo (engine/parallel/local.py), each with --threads torch threads. On a
2-core machine N > 1 cannot be faster: this measures the overhead (broadcast of each step's inputs, two
all-reduces per layer, the head's collectives), not a speed-up. The same prompts on every N; rows are checked
against N = 1 (max |difference| reported). Steps: prefill = --prompts scoring prompts of --tokens tokens in steps
of max_num_batched_tokens; decode = 4 greedy requests of --decode tokens (one token each per step)."""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.parallel.local import run_local
from protocol.sampling import SamplingParams

SHAPE: dict[str, Any] = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=12, num_key_value_heads=6, max_position_embeddings=8192,
                             rms_norm_eps=1e-5, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
SMOKE: dict[str, Any] = dict(vocab_size=1536, hidden_size=96, intermediate_size=192, num_hidden_layers=2)
# Qwen3-30B-A3B's proportions at SHAPE's width: 128 experts of 768 under hidden 2048, top 8 -> 32 of 216, top 4.
MOE_SHAPE: dict[str, Any] = dict(SHAPE, num_hidden_layers=12, head_dim=48, num_experts=32, num_experts_per_tok=4,
                                 moe_intermediate_size=216, decoder_sparse_step=1, norm_topk_prob=True)


def build(folder: Path, smoke: bool, moe: bool = False) -> Path:
    """The random checkpoint of SHAPE (MOE_SHAPE with moe; SMOKE's sizes with --smoke) and a word-level tokenizer
    stub."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    smoke_sizes = {**SMOKE, "moe_intermediate_size": 48, "head_dim": 24} if moe else SMOKE
    shape = {**(MOE_SHAPE if moe else SHAPE), **(smoke_sizes if smoke else {})}
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**shape)) if moe else LlamaForCausalLM(LlamaConfig(**shape))
    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


@dataclass
class Figures:
    prefill_step_ms: float
    decode_step_ms: float
    rows: list[float]  # every scoring row's logprob, in order (compared across N)
    softmax_bytes_per_row: float  # payload one rank puts into the head's collectives per scoring row
    topk_bytes_per_row: float  # the same with top-k = 5
    gather_bytes_per_row: float  # the same when the logits are gathered instead
    hidden_bytes_per_row: float  # rank 0's broadcast of the scored rows' hidden states
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    peak_in_flight: int = 1  # the most engine steps in flight at once (pipeline overlap)


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return [(i * 7919 + seed * 104729) % (vocab - 10) + 5 for i in range(n)]


def _timed_steps(eng: LLMEngine, prompts: list[list[int]], params: SamplingParams
                 ) -> tuple[float, float, Any]:
    """(ms per step, tokens computed per second, the outputs)."""
    steps_before = eng.counters.steps
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(p) for p in prompts) + sum(len(o.new_token_ids) for o in outs)
    return wall * 1000 / max(1, eng.counters.steps - steps_before), tokens / wall, outs


def _head_bytes(eng: LLMEngine, rows: int, k: int) -> tuple[float, float, float]:
    """(softmax's collectives, a gather's, the hidden broadcast) bytes per row, from the group's counters."""
    tp = eng.parallel
    if tp is None:
        return 0.0, 0.0, 0.0
    traffic = tp.group.traffic
    h = torch.randn(rows, eng.model.hidden_size, dtype=eng.model.dtype)
    targets = torch.randint(0, eng.vocab_size, (rows,))
    before = (traffic.all_reduce + traffic.all_gather, traffic.broadcast)
    tp.score_rows(h, eng.model.compute_logits, targets, [k] * rows, "raw_logprobs", rows)
    softmax = (traffic.all_reduce + traffic.all_gather - before[0]) / rows
    hidden = (traffic.broadcast - before[1]) / rows
    before = (traffic.all_reduce + traffic.all_gather, traffic.broadcast)
    tp.compute_logits(h)
    return softmax, (traffic.all_reduce + traffic.all_gather - before[0]) / rows, hidden


def _job(prompts: int, tokens: int, decode: int, eng: LLMEngine) -> Figures:
    vocab = eng.vocab_size
    score = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    gen = SamplingParams(max_tokens=decode, temperature=0.0, ignore_eos=True)
    eng.generate([_ids(32, 999, vocab)], score)  # warm-up
    prefill_ms, prefill_rate, outs = _timed_steps(eng, [_ids(tokens, s, vocab) for s in range(prompts)], score)
    # Decode: prompts of one block each, so nearly every step is 4 decoding rows (2 each with 2 steps in flight).
    decode_ms, decode_rate, _ = _timed_steps(eng, [_ids(eng.config.block_size, 50 + s, vocab) for s in range(4)],
                                             gen)
    softmax, gather, hidden = _head_bytes(eng, 64, 0)
    topk, _, _ = _head_bytes(eng, 64, 5)
    rows = [v for out in outs for v, _ in out.input_token_logprobs]
    return Figures(prefill_ms, decode_ms, rows, softmax, topk, gather, hidden, prefill_rate, decode_rate,
                   eng.peak_in_flight)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench tp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint folder or the embedded model's name (default: SHAPE)")
    ap.add_argument("--sizes", nargs="+", default=["1", "2", "3", "1x2"],
                    help="ranks per run: N (tensor parallel) or TxP (T ranks per stage, P pipeline stages)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--moe", action="store_true", help="MOE_SHAPE; each N > 1 with both splits of the experts")
    a = ap.parse_args(argv)
    if a.smoke:
        a.prompts, a.tokens, a.decode, a.budget = 2, 40, 4, 32
    with tempfile.TemporaryDirectory() as tmp:
        _compare(a, a.model or str(build(Path(tmp), a.smoke, a.moe)))


def _compare(a: argparse.Namespace, model: str) -> None:
    config = EngineConfig(model=model, device="cpu", num_threads=a.threads, enable_prefix_cache=False,
                          max_num_batched_tokens=a.budget, kv_cache_bytes=64 * 1024 * 1024)
    job = partial(_job, a.prompts, a.tokens, a.decode)
    default = "Qwen3-MoE shape (MOE_SHAPE), random" if a.moe else "SmolLM2 shape, 12/6 heads, random"
    print(f"model {a.model or default}; {a.prompts} scoring prompts x {a.tokens} tokens "
          f"(budget {a.budget}), 4 x {a.decode} greedy tokens; {a.threads} thread(s) per rank")
    print("| ranks | prefill ms/step | vs 1 | decode ms/step | vs 1 | max |row - N=1| | log-softmax B/row "
          "| with top-5 B/row | logits gather B/row | hidden bcast B/row | steps in flight | prefill tok/s "
          "| decode tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base: Figures | None = None
    both = (False, True)  # MoE: each split twice, experts by width, then whole experts per rank
    runs = [(size, ep, overlap) for size in a.sizes
            for ep in (both if a.moe and int(size.split("x")[0]) > 1 else (False,))
            for overlap in ((False, True) if "x" in size and int(size.split("x")[1]) > 1 else (True,))]
    for size, ep, overlap in runs:
        tp, pp = (int(x) for x in size.split("x")) if "x" in size else (int(size), 1)
        n = tp * pp
        torch.set_num_threads(a.threads)
        split = replace(config, tensor_parallel_size=tp, pipeline_parallel_size=pp, expert_parallel=ep,
                        pipeline_overlap=overlap)
        fig = job(LLMEngine(config)) if n == 1 else run_local(n, split, job, threads=a.threads)[0]
        base = base or fig
        diff = max((abs(x - y) for x, y in zip(fig.rows, base.rows, strict=True)), default=0.0)
        print(f"| {size}{' EP' if ep else ''}{'' if overlap else ' seq'} | {fig.prefill_step_ms:.1f} | "
              f"{fig.prefill_step_ms / base.prefill_step_ms:.2f} | "
              f"{fig.decode_step_ms:.1f} | {fig.decode_step_ms / base.decode_step_ms:.2f} | {diff:.1e} | "
              f"{fig.softmax_bytes_per_row:.0f} | {fig.topk_bytes_per_row:.0f} | {fig.gather_bytes_per_row:.0f} | "
              f"{fig.hidden_bytes_per_row:.0f} | {fig.peak_in_flight} | {fig.prefill_tokens_per_s:.0f} | "
              f"{fig.decode_tokens_per_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
