"""A real checkpoint cut to its first layers: the same embeddings, final norm, head, tokenizer and shapes (so the
same kernels run on the same row counts), fewer layers to pay for. For tests whose point holds in any layer (bits
that do or do not move with a batch's composition), where all 30 of SmolLM2's layers only multiply the time."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def first_layers(src: Path, dst: Path, layers: int) -> Path:
    """`src`'s checkpoint with layers 0 .. layers-1 only, written to `dst` (made once: an existing one is kept)."""
    if (dst / "config.json").is_file():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for weights in sorted(src.glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as f:
            for name in f.keys():
                m = _LAYER.search(name)
                if m is None or int(m.group(1)) < layers:
                    tensors[name] = f.get_tensor(name)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for extra in src.iterdir():
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name != "config.json":
            shutil.copy(extra, dst / extra.name)
    config = json.loads((src / "config.json").read_text())
    assert layers <= config["num_hidden_layers"], (layers, config["num_hidden_layers"])
    config["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
