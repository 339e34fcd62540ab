"""torch's flash varlen call (engine/layers/varlen.py: varlen_attention_cuda) checked without CUDA: under
FakeTensorMode, on fake CUDA tensors, with the arguments the engine sends in each of its step shapes (prefill and
mixed steps, the decode graphs' fixed-width step, pages of 16 and 256, GQA, windows, bfloat16 and float16), so a
call torch's dispatcher or its fake kernel refuses is found here, not on the one GPU run. And the signature check:
the pinned torch's varlen_attn has the contract's four arguments, torch 2.11's (the lent image's) names exactly
the three it lacks."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.layers.varlen import _NEEDED_ARGS, torch_varlen_missing, varlen_attention_cuda

# (requests' new tokens, requests' keys, block table width): what the engine's steps look like.
STEPS = {
    "prefill": ([512, 300], [512, 300], None),
    "mixed": ([200, 1, 1, 37], [200, 900, 4000, 37 + 128], None),
    "decode-graph": ([1] * 64, [1] * 64, 8192),  # the graphs' table: max_model_len 131,072 / 16 (or / 256)
}


def _args(step: str, page: int, hq: int, hkv: int, d: int, dtype: torch.dtype) -> tuple:
    new, keys, width = STEPS[step]
    blocks = width or max(-(-k // page) for k in keys)
    if width and page == 256:
        blocks = width // 16
    dev = "cuda"
    q = torch.empty(sum(new), hq, d, dtype=dtype, device=dev)
    cache = torch.empty(4096 * page, hkv, d, dtype=dtype, device=dev)  # the runner's [slots, Hkv, D] cache
    pages = cache.view(-1, page, hkv, d)
    cu = torch.empty(len(new) + 1, dtype=torch.int32, device=dev)
    used = torch.empty(len(new), dtype=torch.int32, device=dev)
    table = torch.empty(len(new), blocks, dtype=torch.int32, device=dev)
    max_k = blocks * page if width else max(keys)
    return q, pages, pages, cu, used, table, max(new), max_k, d ** -0.5


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 8, 128), (32, 32, 64), (16, 2, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [None, 4096])
def test_flash_call_on_fake_cuda(step: str, page: int, hq: int, hkv: int, d: int, dtype: torch.dtype,
                                 window: int | None) -> None:
    with FakeTensorMode():
        args = _args(step, page, hq, hkv, d, dtype)
        out = varlen_attention_cuda(*args, window=window)
        assert out.shape == args[0].shape and out.dtype == dtype and out.device.type == "cuda"


def test_flash_call_refuses_softcap_before_torch() -> None:
    with FakeTensorMode():
        args = _args("mixed", 16, 8, 2, 128, torch.bfloat16)
        with pytest.raises(ValueError, match="soft-cap"):
            varlen_attention_cuda(*args, softcap=30.0)


def test_pinned_torch_has_the_four_arguments() -> None:
    from torch.nn.attention.varlen import varlen_attn

    assert torch.__version__.startswith("2.13.0")
    params = inspect.signature(varlen_attn).parameters
    assert set(_NEEDED_ARGS) <= set(params)
    assert all(params[a].kind == inspect.Parameter.KEYWORD_ONLY for a in _NEEDED_ARGS)
    assert torch_varlen_missing() is None


def test_torch_211_signature_names_what_is_missing() -> None:
    """torch 2.11.0's varlen_attn (torch.nn.attention.varlen of that release), its signature only."""

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,  # noqa: ANN001, ANN202
                    scale=None, window_size=(-1, -1)):
        raise AssertionError("never called")

    assert torch_varlen_missing(varlen_attn, "2.11.0+cu130") == (
        "torch 2.11.0+cu130's varlen_attn lacks block_table, seqused_k, enable_gqa")
