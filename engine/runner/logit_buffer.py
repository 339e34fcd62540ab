"""A scoring chunk's one vocab-wide buffer: the float32 logits of its rows, filled and then worked on in place, so
a chunk holds rows x vocab x 4 bytes plus temporaries of rows x VOCAB_SLICE (engine/runner/score_chunks.py).

Where a step would otherwise allocate a second [rows, vocab] tensor it runs in place or over column slices:
- the LM head: a float32 model's projection is the buffer itself; another dtype's is made one HEAD_SLICE of the
  vocabulary at a time and each slice converted into the buffer (no model-dtype copy of the whole rows); with
  head_dtype float32 the upcast projection is the buffer (engine/layers/linear.py's float32_linear);
- the soft-cap and the temperature: in place (the same ops on the same values: the same bits);
- log-softmax: torch's own kernel writing into its input (it reads a row whole before it writes any of it), so
  the values keep the bits of F.log_softmax, which the transformers reference computes;
- the log-sum-exp of raw logits and a target's rank: one slice of columns at a time."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from engine.layers.linear import Linear, float32_linear, linear

# Columns of the vocabulary per slice: the temporaries of a slice are a few rows x VOCAB_SLICE tensors (4096
# columns: under 7% of a 128k-vocabulary row's float32 buffer).
VOCAB_SLICE = 4096
# The LM head's slices, in the model dtype (2 bytes: bfloat16, float16): as many bytes as three float32 slices
# at most. Wider than VOCAB_SLICE as a matmul's width pays: a bf16 head at 128k x 512, 256 rows, on CPU took
# 0.74 s in slices of 4096 and 0.26 s in slices of 16384 (0.21 s whole).
HEAD_SLICE = 4 * VOCAB_SLICE


class Head(Protocol):
    """What float_logits reads of a causal LM (engine/models/llama.py's LlamaForCausalLM, or a tensor-parallel
    rank's, whose lm_head holds its own range of the vocabulary)."""

    @property
    def model(self) -> nn.Module: ...  # .norm: the final norm

    @property
    def lm_head(self) -> Linear: ...

    @property
    def final_logit_softcap(self) -> float | None: ...

    @property
    def float32_head(self) -> bool: ...


def float_logits(head: Head, hidden: torch.Tensor) -> torch.Tensor:
    """hidden: [R, hidden] pre-norm rows -> [R, vocab] float32 raw logits in a new tensor the caller owns: the
    values of head.compute_logits(hidden).float(), with no second vocab-wide tensor on the way."""
    return project_float32(head.model.norm(hidden), head.lm_head, head.final_logit_softcap, head.float32_head)


def project_float32(normed: torch.Tensor, lm_head: Linear, cap: float | None, float32_head: bool = False
                    ) -> torch.Tensor:
    """[R, hidden] final-normed rows -> [R, vocab] float32 capped logits (cap None: none), in a new tensor.
    float32_head: the head projects the upcast rows in float32 and caps there (EngineConfig.head_dtype; the config
    refuses it beside batch-invariant mode, and LM-head adapters are not served, so the head is a plain matrix)."""
    w = lm_head.weight
    if float32_head:
        return soft_cap_(float32_linear(normed, w), cap)
    if w.dtype == torch.float32 or lm_head.row_plan is not None or lm_head.lora is not None \
            or lm_head.bias is not None:
        # The head's own call (batch-invariant mode: its checked row plan, unchanged); float32: its output is the
        # buffer. transformers caps in the model dtype, before the float32 copy: so do we.
        return soft_cap_(lm_head(normed), cap).float()
    out = torch.empty(normed.shape[0], w.shape[0], dtype=torch.float32, device=normed.device)
    for lo in range(0, w.shape[0], HEAD_SLICE):
        hi = min(lo + HEAD_SLICE, w.shape[0])
        out[:, lo:hi] = soft_cap_(linear(normed, w[lo:hi]), cap)  # a row's logit is its own dot product
    return out


def soft_cap_(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """transformers' final soft-cap, tanh(logits / cap) * cap, in place: the same ops in the same order."""
    if cap is None:
        return logits
    return logits.div_(cap).tanh_().mul_(cap)


def log_softmax_(logits: torch.Tensor) -> torch.Tensor:
    """F.log_softmax over the last axis of a float32 [R, V], written into its input: the same kernel, the same bits.
    Its CPU and CUDA kernels reduce a row (max, sum of exponentials) before writing it, each element written by the
    pass that reads it (checked against F.log_softmax in tests/engine/test_logit_buffer.py)."""
    return torch.log_softmax(logits, dim=-1, out=logits)


def log_sum_exp(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R] torch.logsumexp over the last axis, one slice of columns at a time: each slice's, then theirs
    (torch.logsumexp over whole rows would allocate its exponentials at full size)."""
    parts = [torch.logsumexp(logits[:, lo:lo + VOCAB_SLICE], dim=-1) for lo in range(0, logits.shape[1], VOCAB_SLICE)]
    return torch.logsumexp(torch.stack(parts, dim=1), dim=1)


def sum_exp(logits: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """[R, V], [R] -> [R] sum of exp(logits - shift) over the last axis, one slice of columns at a time."""
    total = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    for lo in range(0, logits.shape[1], VOCAB_SLICE):
        total += (logits[:, lo:lo + VOCAB_SLICE] - shift[:, None]).exp_().sum(dim=1)
    return total


def count_at_least(values: torch.Tensor, bound: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
    """[R, V], [R] -> [R] int64 how many of a row's values (minus shift, when given) are >= its bound, one slice of
    columns at a time (a whole-row compare would allocate [R, V] booleans)."""
    total = torch.zeros(values.shape[0], dtype=torch.long, device=values.device)
    for lo in range(0, values.shape[1], VOCAB_SLICE):
        part = values[:, lo:lo + VOCAB_SLICE]
        if shift is not None:
            part = part - shift[:, None]
        total += (part >= bound[:, None]).sum(dim=1, dtype=torch.int32)  # int32: its cast is half an int64's
    return total


def owned_float32(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """compute_logits' result as a float32 tensor score_rows may overwrite: a copy when it is in another dtype or
    shares memory with the rows it was given (a head that returns its input, as tests use)."""
    if logits.dtype != torch.float32:
        return logits.float()
    if logits.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr():
        return logits.clone()
    return logits
