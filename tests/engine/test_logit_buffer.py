"""A scoring chunk's one vocab-wide buffer (engine/runner/logit_buffer.py): the in-place and sliced steps give the
values of the whole-row ones, and a chunk's peak memory, measured on CPU from torch's allocator
(checks/cpu_peak.py), stays within score_chunks' bound of about 4 bytes per logit, where the former form took
about 12."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from checks.cpu_peak import peak_bytes
from engine.models.llama import LlamaForCausalLM
from engine.runner.logit_buffer import (
    HEAD_SLICE,
    count_at_least,
    float_logits,
    log_softmax_,
    log_sum_exp,
    sum_exp,
)
from engine.runner.logprobs import score_rows
from engine.runner.score_chunks import BYTES_PER_LOGIT, score_bytes

VOCAB = 2 * HEAD_SLICE + 123  # three slices of the LM head, the last one short


def _head(dtype: torch.dtype, cap: float | None, vocab: int = VOCAB, hidden: int = 48) -> LlamaForCausalLM:
    """An engine LM (no layers: the final norm and LM head are all scoring uses) with random weights."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=0,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.final_logit_softcap = cap
    return model.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cap", [None, 30.0])
@torch.inference_mode()
def test_float_logits_are_the_heads_logits_in_float32(dtype: torch.dtype, cap: float | None) -> None:
    model = _head(dtype, cap)
    hidden = torch.randn(7, 48, dtype=dtype) * 3
    want = model.compute_logits(hidden).float()
    got = float_logits(model, hidden)
    assert got.dtype == torch.float32 and got.shape == (7, VOCAB)
    # Each slice's logit is its row's own dot product: the same bits as the whole-row matmul here.
    torch.testing.assert_close(got, want, rtol=0, atol=0 if dtype == torch.float32 else 1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the in-place kernel's bits on a GPU"))])
def test_in_place_log_softmax_has_the_bits_of_f_log_softmax(device: str) -> None:
    """Every kernel path: rows of a few columns, under and over 1,024 (CUDA's register and shared-memory kernels)
    and a 128k vocabulary (CUDA's global-memory one)."""
    g = torch.Generator().manual_seed(1)
    for rows, vocab in ((1, 7), (64, 1_001), (5, 49_152), (3, 128_256)):
        x = (torch.randn(rows, vocab, generator=g) * 8).to(device)
        x[0, 3] = float("-inf")
        want = F.log_softmax(x, dim=-1)
        got = x.clone()
        assert log_softmax_(got).data_ptr() == got.data_ptr() and torch.equal(got, want)


def test_sliced_reductions_equal_the_whole_row_ones() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, VOCAB, generator=g) * 6
    torch.testing.assert_close(log_sum_exp(x), torch.logsumexp(x, dim=-1), rtol=0, atol=2e-6)
    m = x.amax(dim=1)
    torch.testing.assert_close(sum_exp(x, m), (x - m[:, None]).exp().sum(dim=1), rtol=2e-6, atol=0)
    bound = x[:, 5]
    assert torch.equal(count_at_least(x, bound), (x >= bound[:, None]).sum(dim=1))
    assert torch.equal(count_at_least(x, bound, m), ((x - m[:, None]) >= bound[:, None]).sum(dim=1))


def _old_chunk(model: LlamaForCausalLM, hidden: torch.Tensor, temps: torch.Tensor) -> None:
    """The former form of one chunk, for the measure's control: the model-dtype logits, their float32 copy, a
    scaled copy, the log-softmax values and a rank's whole-row comparison."""
    logits = model.compute_logits(hidden).float() / temps[:, None]
    scores = F.log_softmax(logits, dim=-1)
    picked = scores[:, 0]
    (scores >= picked[:, None]).sum(dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits"])
@torch.inference_mode()
def test_a_chunks_peak_memory_is_one_float32_buffer_and_slices(dtype: torch.dtype, mode: str) -> None:
    """Every feature of a row at once (soft-cap, temperature, top-k, token ids, rank), in one chunk of 64 rows over
    Llama 3's 128k vocabulary: the peak the CPU allocator sees stays within score_bytes, under 4.5 bytes a logit."""
    rows, vocab = 64, 128_256
    model = _head(dtype, 30.0, vocab=vocab)
    hidden = torch.randn(rows, 48, dtype=dtype)
    targets = torch.randint(0, vocab, (rows,))
    temps = torch.full((rows,), 0.7)
    kw = dict(temps=temps, token_ids=[[1, 2, 3]] * rows, ranks=[True] * rows)
    peak = peak_bytes(lambda: score_rows(hidden, lambda h: float_logits(model, h), targets, [5] * rows, mode,
                                         rows, **kw))
    per_logit = peak / (rows * vocab)
    assert peak <= score_bytes(rows, vocab) and BYTES_PER_LOGIT <= per_logit < 4.5, per_logit
    # The control: the same measure sees the former form's copies (>= 12 bytes a logit).
    old = peak_bytes(lambda: _old_chunk(model, hidden, temps)) / (rows * vocab)
    assert old >= (12 if dtype == torch.float32 else 14), old
