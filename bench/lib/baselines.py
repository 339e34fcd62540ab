"""The alternatives, each used the way a competent user would.

- transformers, one full forward per request + log_softmax + gather (what most people write);
- transformers with padded batches of requests, sorted by length (the stronger hand-written baseline);
- transformers reusing a shared context's past_key_values by hand (multiple choice);
- transformers `generate` on a left-padded batch;
- llama.cpp through llama-cpp-python on the same GGUF file, when it is installed (an optional extra).
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

# Logprob rows of one request: row i is log p(ids[start + 1 + i] | ids[:start + 1 + i]).
Rows = list[float]


def load_transformers(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def _gather(logits: torch.Tensor, targets: list[int]) -> Rows:
    """logits [R, V] -> log_softmax, then the target token of each row."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp[torch.arange(len(targets)), torch.tensor(targets)].tolist()


@torch.inference_mode()
def score_one(model: Any, ids: list[int], start: int) -> Rows:
    """One full forward (the LM head projects every row), log_softmax of the rows from `start`, gather."""
    logits = model(torch.tensor([ids])).logits[0]  # [L, V]
    return _gather(logits[start:-1], ids[start + 1:])


def score_each(model: Any, prompts: list[list[int]], starts: list[int]) -> list[Rows]:
    return [score_one(model, ids, s) for ids, s in zip(prompts, starts, strict=True)]


def padded_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches whose padded size (rows x longest) fits the budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > token_budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    return batches + ([cur] if cur else [])


@torch.inference_mode()
def score_padded(model: Any, prompts: list[list[int]], starts: list[int], token_budget: int,
                 pad_id: int = 0) -> list[Rows]:
    """Right-padded batches with an attention mask; padding never changes the rows of real tokens."""
    out: list[Rows] = [[] for _ in prompts]
    for batch in padded_batches([len(p) for p in prompts], token_budget):
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            ids[r, :len(prompts[i])] = torch.tensor(prompts[i])
            mask[r, :len(prompts[i])] = 1
        logits = model(ids, attention_mask=mask).logits  # [B, W, V]
        for r, i in enumerate(batch):
            p, s = prompts[i], starts[i]
            out[i] = _gather(logits[r, s:len(p) - 1], p[s + 1:])
    return out


def _cache_arg(model: Any) -> str:
    # transformers 5.x renamed forward's past_key_values to cache (the old name warns, then goes away).
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.inference_mode()
def score_shared_context(model: Any, context: list[int], endings: list[list[int]], pad_id: int = 0) -> list[Rows]:
    """Rows of every ending after one shared context (N = len(context) - 1), reusing the context's KV cache:
    one forward of the context keeping only its last row's logits, then all endings as one right-padded
    batch over the cache repeated per ending."""
    out = model(torch.tensor([context]), use_cache=True, logits_to_keep=1)
    first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # scores each ending's first token
    cache = _cache_of(out)
    cache.batch_repeat_interleave(len(endings))
    width = max(len(e) for e in endings)
    ids = torch.full((len(endings), width), pad_id, dtype=torch.long)
    mask = torch.ones((len(endings), len(context) + width), dtype=torch.long)
    for r, e in enumerate(endings):
        ids[r, :len(e)] = torch.tensor(e)
        mask[r, len(context) + len(e):] = 0
    logits = model(ids, attention_mask=mask, **{_cache_arg(model): cache}).logits  # [E, W, V]
    rows = []
    for r, e in enumerate(endings):
        rows.append([first[e[0]].item()] + _gather(logits[r, :len(e) - 1], e[1:]))
    return rows


@torch.inference_mode()
def generate_padded(model: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list[list[int]]:
    """Greedy `generate` on one left-padded batch, exactly new_tokens each (EOS does not stop it)."""
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    # No eos_token_id: like the engine's ignore_eos, every row gets its new_tokens greedy tokens.
    cfg = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id,
                           eos_token_id=None, bos_token_id=None)
    out = model.generate(ids, attention_mask=mask, generation_config=cfg)
    return out[:, width:].tolist()


# --- llama.cpp (optional) ------------------------------------------------------------------------------

def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


# Scores 16 tokens with all logits on, the way the workloads use it, in a child process.
_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, verbose=False)
llm.eval(list(range(1, 17)))
assert llm.scores.shape[0] >= 16
llm.close()
"""


def llamacpp_probe(gguf: Path, timeout_s: float = 300) -> str | None:
    """None when llama.cpp scores a few tokens of `gguf` in a child process; else why not, in a few words.
    A llama.cpp build can crash the process outright (seen: a build compiled with AMX on an AMX Xeon, signal 11
    in its first decode), and an optional baseline must not take the whole bench down with it."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, str(gguf)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"a 16-token probe did not finish in {timeout_s:.0f} s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        return f"a 16-token probe was killed by signal {-proc.returncode} ({signal.Signals(-proc.returncode).name})"
    last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
    return f"a 16-token probe failed: {last[:200]}"


class LlamaCpp:
    """llama.cpp on the GGUF file. Requests run one after another: llama-cpp-python's high-level API scores
    and generates one sequence at a time."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int, all_logits: bool) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=min(n_ctx, 2048), n_ubatch=512,
                         logits_all=all_logits, n_threads=threads, n_threads_batch=threads, verbose=False)

    def score(self, ids: list[int], start: int) -> tuple[Rows, list[int]]:
        """(logprob rows from `start`, argmax token of each row)."""
        self.llm.reset()
        self.llm.eval(ids)
        logits = torch.from_numpy(self.llm.scores[start:len(ids) - 1])  # [R, V], a view of llama's buffer
        lp = torch.log_softmax(logits, dim=-1)
        rows = lp[torch.arange(len(ids) - 1 - start), torch.tensor(ids[start + 1:])].tolist()
        return rows, lp.argmax(dim=-1).tolist()

    def generate(self, ids: list[int], new_tokens: int) -> list[int]:
        self.llm.reset()
        out: list[int] = []
        for tok in self.llm.generate(ids, top_k=1, temp=0.0, reset=True):
            out.append(tok)
            if len(out) == new_tokens:
                break
        return out

    def close(self) -> None:
        self.llm.close()
