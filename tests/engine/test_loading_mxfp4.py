"""The hub's MXFP4 expert layout (engine/loading/mxfp4.py): the dequantization against the format's definition and
transformers' own, and a tiny gpt-oss checkpoint quantized by tests/helpers/tiny_gpt_oss.py's quantizer, served by
the engine against transformers' dequantized model (Mxfp4Config(dequantize=True), on CPU)."""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssForCausalLM, Mxfp4Config
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from engine.loading.mxfp4 import dequantize
from tests.helpers.engine import assert_rows, greedy, make_engine, rand_ids, scoring
from tests.helpers.families import hf_generate
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_gpt_oss import gpt_oss_path, quantize_mxfp4, write_mxfp4


def test_dequantize_by_the_format() -> None:
    """Byte 0x2F holds codes 15 (low nibble, first: -6) and 2 (1.0); scale 128 is 2 ** 1; the result is transposed
    to [E, cols, rows] as the checkpoint's float layout."""
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x2F
    blocks[0, 0, 0, 15] = 0x9E  # codes 14 (-4) then 9 (-0.5)
    w = dequantize(blocks, torch.full((1, 1, 1), 128, dtype=torch.uint8))
    assert w.shape == (1, 32, 1)
    assert w[0, :2, 0].tolist() == [-12.0, 2.0]
    assert w[0, 30:, 0].tolist() == [-8.0, -1.0]
    assert not w[0, 2:30].any()


def test_dequantize_is_transformers() -> None:
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 2, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, (3, 5, 2), generator=g, dtype=torch.uint8)
    assert torch.equal(dequantize(blocks, scales), convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))


def test_quantizer_round_trips() -> None:
    """The helper's quantizer encodes values the dequantization reads back exactly, within FP4's rounding of w."""
    w = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1))
    blocks, scales, values = quantize_mxfp4(w)
    assert torch.equal(dequantize(blocks, scales), values.transpose(1, 2))
    assert (values - w).abs().max() <= w.abs().max() / 4  # half the widest FP4 step (2 of 6) at a block's scale


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The tiny checkpoint in the hub's layout, and the float weights it encodes."""
    path = tmp_path_factory.mktemp("mxfp4") / "gpt-oss-mxfp4"
    return path, write_mxfp4(gpt_oss_path(), path)


@cache
def _dequantized(path: Path) -> torch.nn.Module:
    return GptOssForCausalLM.from_pretrained(path, quantization_config=Mxfp4Config(dequantize=True),
                                             dtype=torch.float32).eval()


@torch.inference_mode()
def _ref_scores(path: Path, ids: list[int], start: int) -> list[float]:
    lp = torch.log_softmax(_dequantized(path)(torch.tensor([ids])).logits[0].float(), -1)
    return lp[torch.arange(start, len(ids) - 1), torch.tensor(ids[start + 1:])].tolist()


def test_engine_is_transformers_dequantized(mxfp4: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """transformers dequantizes to the values the quantizer encoded; the engine's rows (chunked, from two starts)
    and greedy tokens match that model within 1e-4, and the quantization moved them from the float checkpoint's."""
    path, encoded = mxfp4
    ref = _dequantized(path)
    for name, values in encoded.items():
        layer, proj = int(name.split(".")[2]), name.rsplit(".", 1)[1]
        assert torch.equal(getattr(ref.model.layers[layer].mlp.experts, proj), values), name
    ids = rand_ids(37, seed=4)
    eng = make_engine(path, max_num_batched_tokens=5)
    for start in (0, 17):
        out = eng.generate([ids], scoring(start), check=True)[0]
        want = _ref_scores(path, ids, start)
        assert_rows(out.input_token_logprobs, ids, start, want)
    assert max(abs(a - b) for a, b in zip(want, hf_scores(gpt_oss_path(), ids, 17), strict=True)) > 1e-2
    prompts = [rand_ids(n, seed=100 + n) for n in (3, 11)]
    outs = eng.generate(prompts, greedy(8), check=True)
    with torch.inference_mode():
        for p, o in zip(prompts, outs, strict=True):
            assert o.new_token_ids == hf_generate(ref, p, 8).sequences[0, len(p):].tolist()


def test_missing_scales_refused(mxfp4: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    path, _ = mxfp4
    other = tmp_path / "no-scales"
    shutil.copytree(path, other)
    state = load_file(str(other / "model.safetensors"))
    del state["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(state, str(other / "model.safetensors"), metadata={"format": "pt"})
    assert json.loads((other / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    with pytest.raises(ValueError, match="model.layers.1.mlp.experts.down_proj_blocks without .*down_proj_scales"):
        make_engine(other)
