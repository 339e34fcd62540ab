"""The MLP activations of the served families by their config name (`hidden_act`), computed as transformers'
`ACT2FN` computes them (the same torch functions). A table of our own because importing transformers.activations
pulls in its hub-kernel and distributed-loading machinery at every engine process's start (a worker replica, a rank,
an offline actor); a name not in the table is still looked up there, on first use."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

# Each entry is the torch module transformers' class of that name calls (GELUActivation: nn.functional.gelu;
# GELUTanh: gelu with approximate="tanh"; SiLUActivation: nn.functional.silu).
_TABLE: dict[str, Callable[[], nn.Module]] = {
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "gelu": nn.GELU,
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
}


def activation(name: str) -> nn.Module:
    """The activation module for a config's `hidden_act` (or a vision tower's)."""
    make = _TABLE.get(name)
    if make is not None:
        return make()
    from transformers.activations import ACT2FN

    return ACT2FN[name]
