"""The hub's MXFP4 expert weights (gpt-oss: config quantization_config.quant_method "mxfp4"), dequantized at load.

The format (OCP Microscaling, as transformers.integrations.mxfp4 reads it): a weight W [E, rows, cols] is stored
as `<name>_blocks` [E, rows, cols / 32, 16] uint8, two FP4 (e2m1) codes a byte, the low nibble first, and
`<name>_scales` [E, rows, cols / 32] uint8, one E8M0 exponent (biased by 127) per block of 32 values:
W[e, r, 32 g + j] = FP4[code j of block (e, r, g)] * 2 ** (scales[e, r, g] - 127). The checkpoint's float layout
of the same weight is W transposed, [E, cols, rows] (transformers' GptOssExperts: x @ W), which is what this
returns under the name without the suffix.

Every value is exact in float32 (a 3-bit-significand code times a power of two), so the engine's float32 model
holds the very numbers the quantized checkpoint encodes. The engine has no MXFP4 matmul on any device: the experts
run dequantized (in the engine's dtype) everywhere."""

from __future__ import annotations

from typing import Any

import torch

QUANT_METHOD = "mxfp4"
# FP4 e2m1 by code: sign bit 3, two exponent bits, one mantissa bit.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SUFFIXES = ("_blocks", "_scales")


def is_mxfp4(cfg: Any) -> bool:
    """The config's quantization_config says the hub's MXFP4 layout (a dict, or transformers' Mxfp4Config)."""
    q = getattr(cfg, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method)) == QUANT_METHOD


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [..., rows, G, 16] uint8, scales [..., rows, G] uint8 -> [..., G * 32, rows] float32 (transposed)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales {tuple(scales.shape)} "
                         f"{scales.dtype} do not pair (uint8 both, blocks [..., G, 16], scales [..., G])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # [..., G, 16, 2]: low nibble first
    values = lut[codes].flatten(-3, -1).unflatten(-1, (scales.shape[-1], 32))  # [..., rows, G, 32]
    w = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127).flatten(-2)  # [..., rows, G * 32]
    return w.transpose(-1, -2).contiguous()


class Mxfp4Pairs:
    """Pairs each weight's `_blocks` and `_scales` as the loader reads them (they may sit in different shards):
    take() returns (weight name, dequantized tensor) once both halves are in, else None."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    @staticmethod
    def claims(stored: str) -> bool:
        return stored.endswith(SUFFIXES)

    def take(self, stored: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        suffix = next(s for s in SUFFIXES if stored.endswith(s))
        name = stored[:-len(suffix)]
        parts = self.pending.setdefault(name, {})
        parts[suffix] = tensor
        if len(parts) < len(SUFFIXES):
            return None
        del self.pending[name]
        return name, dequantize(parts["_blocks"], parts["_scales"])

    def check_done(self, path: Any) -> None:
        """Raises naming a weight whose other half the checkpoint lacks."""
        if self.pending:
            name, parts = next(iter(self.pending.items()))
            lacking = [s for s in SUFFIXES if s not in parts]
            raise ValueError(f"checkpoint {path} has {name}{next(iter(parts))} without {name}{lacking[0]} "
                             f"(quantization_config quant_method {QUANT_METHOD})")
