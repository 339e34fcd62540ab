"""Embeddings that a checkpoint fills."""

from __future__ import annotations

import torch
from torch import nn


def unset_embedding(num: int, dim: int) -> nn.Embedding:
    """An Embedding whose weight the checkpoint sets (the loader refuses a missing one), left unset: nn.Embedding's
    own normal_ init on the meta device goes through torch._refs, whose first call imports torch._dynamo, about a
    second of every worker's start spent on values the checkpoint overwrites."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))
