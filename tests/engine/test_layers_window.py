"""engine/layers/window.py on its own: which keys a query sees, the batched decode mask, and the soft-capped path
against transformers' eager attention."""

from __future__ import annotations

import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from engine.layers.window import attend, decode_window_bias, window_mask


def test_window_mask_keeps_the_last_window_positions() -> None:
    # Queries at positions 5, 6, 7; window 3: each sees itself and the two positions before it.
    got = window_mask(5, 3, 3, torch.device("cpu")).int().tolist()
    assert got == [[0, 0, 0, 1, 1, 1, 0, 0],
                   [0, 0, 0, 0, 1, 1, 1, 0],
                   [0, 0, 0, 0, 0, 1, 1, 1]]
    assert window_mask(5, 3, None, torch.device("cpu")).int().tolist()[0] == [1] * 6 + [0, 0]


def test_decode_bias_masks_keys_older_than_the_window() -> None:
    # Two decoding queries at positions 4 and 1 (keys 0..4 and 0..1 real, the rest padding), window 2.
    pad = torch.tensor([[0.0] * 5, [0.0, 0.0] + [float("-inf")] * 3])[:, None, None, :]
    got = decode_window_bias(pad, torch.tensor([4, 1]), 2)[:, 0, 0]
    inf = float("-inf")
    assert got.tolist() == [[inf, inf, inf, 0.0, 0.0], [0.0, 0.0, inf, inf, inf]]


def test_softcapped_attention_is_transformers_eager() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=g) * 3 for _ in range(3))
    mask = window_mask(0, 6, 3, torch.device("cpu"))

    class Module:  # what eager_attention_forward reads from the attention layer
        num_key_value_groups = 1
        training = False

    bias = torch.zeros(6, 6).masked_fill(~mask, torch.finfo(torch.float32).min)
    want, _ = eager_attention_forward(Module(), q, k, v, bias, scaling=0.3, softcap=2.0)  # [1, n, H, D]
    got = attend(q, k, v, mask, 0.3, 2.0)  # [1, H, n, D]
    assert torch.allclose(got.transpose(1, 2), want, atol=1e-6, rtol=0)
    # The cap matters here, and without it the path is SDPA's.
    assert not torch.allclose(attend(q, k, v, mask, 0.3, None), got, atol=1e-3)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    assert torch.equal(attend(q, k, v, mask, 0.3, None), sdpa)
