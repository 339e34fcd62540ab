"""Where the Triton kernel tests run: CUDA, else Triton's interpreter on CPU (tests/conftest.py sets
TRITON_INTERPRET=1 without an NVIDIA device). triton is a dev dependency, so a test fails, never skips, for want
of it."""

from __future__ import annotations

import os

import torch


def kernel_device() -> torch.device:
    from engine.layers import varlen_triton

    assert varlen_triton.available(), "triton is not installed: pyproject's dev extras pin it"
    if torch.cuda.is_available():
        return torch.device("cuda")
    assert os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py sets TRITON_INTERPRET=1 without a GPU"
    return torch.device("cpu")
