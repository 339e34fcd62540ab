"""Which attention backend a model runner uses (config field attention_backend: auto | torch | varlen).

auto: the one-call-per-layer varlen backend on CUDA when a CUDA kernel serves this model: torch's flash kernel
(engine/layers/varlen.py: kernel_blocker), else our Triton kernel (triton_blocker; in half precision only, so
float32 keeps the path its exactness was proven on), else today's TorchPagedAttention, which stays the CPU path
(it batches decodes into one padded call and is faster there than the reference's per-request loop:
docs/design/gpu.md). varlen: that backend whatever the device and dtype, the reference kernel where no CUDA one
serves (the CPU tests run the engine this way). A fallback is said once in the log, with its reasons."""

from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig
from engine.invariant.attention import InvariantPagedAttention
from engine.layers.attention import AttentionBackend, TorchPagedAttention, VarlenKernel, VarlenPagedAttention
from engine.layers.varlen import kernel_blocker, triton_blocker, varlen_attention_cuda, varlen_attention_reference
from engine.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)


def choose_attention(config: EngineConfig, model: LlamaForCausalLM, device: torch.device) -> AttentionBackend:
    want = config.attention_backend
    if config.batch_invariant:
        if want == "varlen":
            log.info("attention_backend=varlen ignored: batch-invariant mode has its own attention")
        return InvariantPagedAttention()
    if want == "torch":
        return TorchPagedAttention()
    if config.world_size > 1:  # the follower ranks run TorchPagedAttention on the driver's metadata
        log.info("attention: torch paged path (a split worker runs the varlen backend on no rank)")
        return TorchPagedAttention()
    # A hybrid's linear-attention layers have no self_attn.
    attns = [layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")]
    softcap = any(attn.softcap is not None for attn in attns)
    sinks = any(getattr(attn, "sinks", None) is not None for attn in attns)
    kernel, reason = cuda_kernel(device, model.dtype, config.block_size, model.head_dim, softcap,
                                 half_only=want == "auto", sinks=sinks)
    if kernel is not None:
        log.info("attention: varlen backend, %s (one call per layer per step)%s", kernel.__name__,
                 f"; torch's flash kernel: {reason}" if reason else "")
        return VarlenPagedAttention(config.block_size, kernel)
    if want == "auto":
        if device.type == "cuda":  # on CPU the torch path is the intended one, nothing to say
            log.info("attention: torch paged path, since the varlen kernel cannot serve here: %s", reason)
        return TorchPagedAttention()
    log.info("attention: varlen backend with the pure-torch reference kernel (%s)", reason)
    return VarlenPagedAttention(config.block_size, varlen_attention_reference)


def cuda_kernel(device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int, softcap: bool,
                half_only: bool = True, sinks: bool = False) -> tuple[VarlenKernel | None, str]:
    """The CUDA kernel that serves the contract here, flash first, then Triton (half_only: not for float32), and
    why the ones before it did not (empty when the first serves). sinks: the model has attention sinks, which only
    the Triton kernel (and the torch paths) compute."""
    flash = kernel_blocker(device, dtype, block_size, head_dim, softcap, sinks)
    if flash is None:
        return varlen_attention_cuda, ""
    if device.type != "cuda":
        return None, flash
    if half_only and dtype == torch.float32:
        return None, f"{flash}; Triton kernel: float32 keeps the torch path under attention_backend auto"
    tri = triton_blocker(device, dtype, block_size, head_dim)
    if tri is None:
        from engine.layers.varlen_triton import varlen_attention_triton

        return varlen_attention_triton, flash
    return None, f"{flash}; Triton kernel: {tri}"


# The page sizes tried, in order: the engine's default, then FlashAttention 2's paged rule (a multiple of 256).
PAGE_SIZES = (16, 256)


def pick_block_size(device: torch.device, dtype: torch.dtype, head_dim: int,
                    softcap: bool) -> tuple[int, dict[int, tuple[str | None, str]]]:
    """The block_size that gets torch's flash kernel (16 where it takes such pages; 256 where, as FlashAttention
    2's paged mode, it takes a block table only with pages of a multiple of 256), else 16 (the Triton kernel or
    the torch path serve any page). Also each size's kernel and the reasons the ones before it did not serve."""
    kernels = {bs: cuda_kernel(device, dtype, bs, head_dim, softcap) for bs in PAGE_SIZES}
    found = {bs: (k.__name__ if k is not None else None, why) for bs, (k, why) in kernels.items()}
    flash = [bs for bs, (k, _) in kernels.items() if k is varlen_attention_cuda]
    return (flash[0] if flash else PAGE_SIZES[0]), found
