"""The hub's FP8 block-scaled layout (engine/loading/fp8.py): a tiny DeepSeek-V3 quantized in it (our own quantizer,
tests/helpers/tiny_deepseek_v3.py) loads and scores within 1e-4 of transformers' own dequantized model
(FineGrainedFP8Config(dequantize=True), which runs on CPU); partial edge blocks dequantize per the format; the
layouts it does not read are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, FineGrainedFP8Config

from engine.loading.fp8 import dequantize
from tests.helpers.engine import assert_rows, make_engine, rand_ids, scoring
from tests.helpers.tiny_deepseek_v3 import build_deepseek_v3, quantize_checkpoint, quantize_fp8_blocks


@pytest.fixture(scope="module")
def fp8_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fp8")
    # Block 8 divides every tiny shape: transformers' dequantizer derives the block from the scale grid and takes
    # whole blocks only.
    return quantize_checkpoint(build_deepseek_v3(root / "src", "dsv3", seed=7), root / "fp8", block=8)


def test_scores_equal_transformers_dequantized(fp8_path: Path) -> None:
    ref = AutoModelForCausalLM.from_pretrained(str(fp8_path), dtype=torch.float32,
                                               quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
    ids = rand_ids(29, seed=3)
    with torch.inference_mode():
        lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), -1)
    eng = make_engine(fp8_path, max_num_batched_tokens=5)
    for start in (0, 11):
        want = lp[torch.arange(start, len(ids) - 1), torch.tensor(ids[start + 1:])].tolist()
        assert_rows(eng.generate([ids], scoring(start), check=True)[0].input_token_logprobs, ids, start, want)


def test_partial_edge_blocks() -> None:
    """[40, 300] in 128 x 128 blocks: scale_inv [1, 3], the last column block 44 wide."""
    torch.manual_seed(0)
    w = torch.randn(40, 300)
    q, scale = quantize_fp8_blocks(w, 128)
    assert scale.shape == (1, 3)
    got = dequantize(q, scale, (128, 128))
    for c in range(3):
        cols = slice(c * 128, (c + 1) * 128)
        assert torch.equal(got[:, cols], q[:, cols].float() * scale[0, c])
    assert (got - w).abs().max().item() <= 0.07 * w.abs().max().item()  # e4m3's 3-bit mantissa


@pytest.mark.parametrize(("patch", "field"), [({"quant_method": "bitsandbytes"}, "quant_method"),
                                              ({"weight_block_size": None}, "weight_block_size")])
def test_refused_layouts(fp8_path: Path, tmp_path: Path, patch: dict, field: str) -> None:
    other = tmp_path / "other"
    other.mkdir()
    for f in fp8_path.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "config.json").read_text())
    cfg["quantization_config"].update(patch)
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field):
        make_engine(other)
