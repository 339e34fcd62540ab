"""Batch-invariant mode (issue 17): the switch.

With the mode on, a request's values have the same float bits whatever else runs in its steps, wherever its
chunks start and end and whatever is cached: every matmul has at least MIN_ROWS rows on CPU and fixed tiles
elsewhere (models/linear.py), the MLP's SiLU avoids torch's CPU kernel whose scalar tail rounds unlike its vector
lanes (models/llama.py), attention reduces keys in fixed blocks from position 0 (invariant_attention.py),
log-softmax runs in fixed tiles of rows (logprobs.py) and the scorer never takes the log-sum-exp shortcut
(scorer.py).

ModelRunner switches it on from EngineConfig.batch_invariant, once, after loading the model:
    set_batch_invariant(model, True)                    # linears (layers and LM head), MLP activation
    backend = InvariantPagedAttention()                 # instead of TorchPagedAttention()
    RowScorer(..., batch_invariant=True)                # every scoring row through the full projection
    row_scores(logits, mode, invariant=True)            # the sampled token's logprob / top-k
Bits are the same for the same thread count and CPU (MKL picks kernels by both).
"""

from __future__ import annotations

from torch import nn

from engine.layers.linear import Linear
from engine.models.llama import MLP


def set_batch_invariant(model: nn.Module, on: bool) -> None:
    """Switch every Linear (fused q/k/v, o, gate/up, down, LM head) and MLP of the model. (RMSNorm needs no
    switch: its rsqrt, mean and products give a row the same bits at any row count - tested.)"""
    for m in model.modules():
        if isinstance(m, (Linear, MLP)):
            m.batch_invariant = on

