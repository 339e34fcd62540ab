"""The engine's Linear: oneDNN's inner product on CPU float32 for a vocab-wide layer (the LM head), aten
otherwise; the same values as F.linear either way, and the fused q/k/v and gate/up projections give the
same outputs as the separate layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import linear as lin
from engine.layers.linear import Linear, linear, use_onednn


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out", [200, lin.MIN_WIDE_FEATURES])
def test_linear_matches_f_linear(rows: int, bias: bool, out: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(out, 96, generator=g)
    b = torch.randn(out, generator=g) if bias else None
    torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_kernel_choice() -> None:
    w = torch.randn(64, 32)
    wide = torch.randn(lin.MIN_WIDE_FEATURES, 32)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch build")
    assert not use_onednn(torch.randn(64, 32), w)  # a layer: aten (exactness through many layers)
    assert use_onednn(torch.randn(1, 32), wide)  # the LM head, a decode step's or a scoring block's
    assert use_onednn(torch.randn(256, 32), wide)
    assert not use_onednn(torch.randn(16, 32).bfloat16(), wide.bfloat16())  # float32 only
    assert not use_onednn(torch.randn(2, 16, 32), wide)  # 2-D inputs only


def test_non_contiguous_input() -> None:
    x = torch.randn(40, 64)[::2]  # strided rows
    w = torch.randn(lin.MIN_WIDE_FEATURES, 64)
    torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_module_forward() -> None:
    m = Linear(32, 16, bias=True)
    x = torch.randn(12, 32)
    with torch.inference_mode():
        torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)


def test_fused_projections_equal_separate(tiny_models) -> None:  # noqa: ANN001
    from engine.loading.loader import load_model
    from tests.helpers.reference import hf_model

    path = tiny_models["qwen2"]  # q/k/v with biases
    model, _ = load_model(path, "float32", torch.device("cpu"))
    ref = hf_model(str(path))
    x = torch.randn(20, ref.config.hidden_size)
    with torch.inference_mode():
        for ours, theirs in zip(model.model.layers, ref.model.layers, strict=True):
            attn, mlp = ours.self_attn, ours.mlp
            assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj")  # the separate copies are freed
            a = theirs.self_attn
            torch.testing.assert_close(attn.qkv_proj(x), torch.cat([a.q_proj(x), a.k_proj(x), a.v_proj(x)], -1),
                                       rtol=1e-5, atol=1e-5)
            m = theirs.mlp
            torch.testing.assert_close(mlp.gate_up_proj(x), torch.cat([m.gate_proj(x), m.up_proj(x)], -1),
                                       rtol=1e-5, atol=1e-5)
