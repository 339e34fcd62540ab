"""Which attention backend a model runner uses (config field attention_backend: auto | torch | varlen).

auto: the one-call-per-layer varlen backend on CUDA when the flash kernel serves this model (engine/layers/
varlen.py: kernel_blocker), else today's TorchPagedAttention, which stays the CPU path (it batches decodes into one
padded call and is faster there than the reference's per-request loop: docs/design/gpu.md). varlen: that backend
whatever the device, with the pure-torch reference kernel where the CUDA one cannot serve (the CPU tests run the
engine this way). A fallback is said once in the log, with its reason."""

from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig
from engine.invariant.attention import InvariantPagedAttention
from engine.layers.attention import AttentionBackend, TorchPagedAttention, VarlenPagedAttention
from engine.layers.varlen import kernel_blocker, varlen_attention_cuda, varlen_attention_reference
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
    if config.tensor_parallel_size > 1:  # the follower ranks run TorchPagedAttention on the driver's metadata
        log.info("attention: torch paged path (tensor_parallel_size > 1 runs the varlen backend on no rank)")
        return TorchPagedAttention()
    softcap = any(layer.self_attn.softcap is not None for layer in model.model.layers)
    reason = kernel_blocker(device, model.dtype, config.block_size, model.head_dim, softcap)
    if reason is None:
        log.info("attention: varlen backend, torch's flash kernel (one call per layer per step)")
        return VarlenPagedAttention(config.block_size, varlen_attention_cuda)
    if want == "auto":
        if device.type == "cuda":  # on CPU the torch path is the intended one, nothing to say
            log.info("attention: torch paged path, since the varlen kernel cannot serve here: %s", reason)
        return TorchPagedAttention()
    log.info("attention: varlen backend with the pure-torch reference kernel (%s)", reason)
    return VarlenPagedAttention(config.block_size, varlen_attention_reference)
