"""The hub's FP8 block-scaled weights (DeepSeek-V3/R1, Kimi-K2, many others): config.json's quantization_config
{quant_method: fp8, weight_block_size: [bm, bn]}, each quantized weight stored as float8_e4m3fn [out, in] beside
`<name>_scale_inv` float32 [ceil(out / bm), ceil(in / bn)]; the value is weight x scale_inv of its block (the name
says inverse because the quantizer divided by it). Edge blocks may be partial.

Dequantized at load, on the CPU, to the served dtype: the engine's matmuls are then those of any checkpoint, and a
float32 engine reproduces a float32 reference of the dequantized weights within 1e-4. On a GPU with FP8 matmuls
(Hopper), serving the FP8 weights with block-scaled kernels would halve the weights' memory against bfloat16 but
round the activations to FP8 per 128-wide group as well, which moves logprobs far past 1e-4; the engine keeps the
dequantized weights everywhere (docs/design/models.md)."""

from __future__ import annotations

from typing import Any

import torch

SCALE_SUFFIX = "_scale_inv"
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def block_size(cfg: Any) -> tuple[int, int] | None:
    """(bm, bn) of an FP8 block-scaled checkpoint; None when it is not one. Refuses the FP8 layouts it does not
    read, naming the field."""
    q = getattr(cfg, "quantization_config", None)
    if q is None:
        return None
    q = q if isinstance(q, dict) else q.to_dict()
    method = q.get("quant_method")
    if method != "fp8":
        raise ValueError(f"config field quantization_config has quant_method {method!r}, which this engine does not "
                         "read (fp8 with weight_block_size is, and mxfp4: engine/loading/mxfp4.py)")
    size = q.get("weight_block_size")
    if not size or len(size) != 2:
        raise ValueError("config field quantization_config.weight_block_size must be [rows, columns] (per-tensor "
                         f"FP8 scales are not read), not {size!r}")
    return int(size[0]), int(size[1])


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight [out, in] FP8, scale_inv [ceil(out / bm), ceil(in / bn)] -> float32 [out, in]."""
    out, inp = weight.shape
    bm, bn = block
    if tuple(scale_inv.shape) != (-(-out // bm), -(-inp // bn)):
        raise ValueError(f"weight_scale_inv of shape {tuple(scale_inv.shape)} does not tile a weight of shape "
                         f"{(out, inp)} in blocks of {block} (quantization_config.weight_block_size)")
    scale = scale_inv.float().repeat_interleave(bm, dim=0)[:out].repeat_interleave(bn, dim=1)[:, :inp]
    return weight.float() * scale


class Fp8Weights:
    """Pairs each FP8 weight with its scale as the checkpoint's tensors stream by (a pair may span two files)."""

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block
        self.pending: dict[str, torch.Tensor] = {}  # weight name (or name + SCALE_SUFFIX) -> tensor, half a pair

    def take(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        """A stored tensor -> (its weight name, the dequantized weight) once both halves are here; a tensor that is
        neither half passes through; None while its other half is still to come."""
        if name.endswith(SCALE_SUFFIX):
            weight_name = name.removesuffix(SCALE_SUFFIX)
            weight = self.pending.pop(weight_name, None)
            if weight is None:
                self.pending[name] = tensor
                return None
            return weight_name, dequantize(weight, tensor, self.block)
        if tensor.dtype in FP8_DTYPES:
            scale = self.pending.pop(name + SCALE_SUFFIX, None)
            if scale is None:
                self.pending[name] = tensor
                return None
            return name, dequantize(tensor, scale, self.block)
        return name, tensor

    def check_done(self) -> None:
        if self.pending:
            names = sorted(self.pending)[:3]
            raise ValueError(f"FP8 checkpoint has weights without their {SCALE_SUFFIX} (or the reverse): {names}")
