"""Load a Hugging Face checkpoint folder into our own model code: build on `meta`, load weights by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from engine.loading import fp8
from engine.loading.mxfp4 import Mxfp4Pairs, is_mxfp4
from engine.models import model_class
from engine.models.llama import LlamaForCausalLM

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


def exact_float32(device: torch.device, dtype: str) -> None:
    """float32 on CUDA runs IEEE matmuls, never TF32: TF32's 10-bit mantissa moves logprobs by ~1e-3, past the
    1e-4 the engine is held to. torch's default is already off; this keeps a library or caller that turned it on
    in the same process from moving the engine's values. Process-wide, like torch's flags; the CPU path has none."""
    if device.type == "cuda" and dtype == "float32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def load_config(path: Path) -> Any:
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model folder: no config.json")
    return AutoConfig.from_pretrained(path)


def load_model(path: str | Path, dtype: str, device: torch.device, float32_head: bool = False
               ) -> tuple[LlamaForCausalLM, Any]:
    """Returns (model in eval mode on `device`, its transformers config). float32_head: EngineConfig's."""
    path = Path(path)
    exact_float32(device, dtype)
    cfg = load_config(path)
    cls = model_class(getattr(cfg, "architectures", None))
    with torch.device("meta"):
        model = cls(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    wanted = dict(model.named_parameters())
    tied = model.tie_word_embeddings
    state: dict[str, torch.Tensor] = {}
    mxfp4 = Mxfp4Pairs() if is_mxfp4(cfg) else None  # the hub's MXFP4 experts, dequantized as they are read
    block = None if mxfp4 is not None else fp8.block_size(cfg)  # (which refuses any other quant_method)
    pairs = fp8.Fp8Weights(block) if block is not None else None  # FP8 weights dequantized with their scales
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for stored in f.keys():
                raw: torch.Tensor | None = None
                if mxfp4 is not None and mxfp4.claims(stored):
                    pair = mxfp4.take(stored, f.get_tensor(stored))
                    if pair is None:
                        continue
                    stored, raw = pair
                name = cls.checkpoint_name(stored)
                weight_name = name.removesuffix(fp8.SCALE_SUFFIX) if pairs is not None else name
                if weight_name in wanted and not (tied and weight_name == "lm_head.weight"):
                    got: tuple[str, torch.Tensor] | None = (name, f.get_tensor(stored) if raw is None else raw)
                    if pairs is not None:
                        got = pairs.take(*got)
                    if got is not None:
                        tensor = cls.checkpoint_tensor(got[0], got[1], wanted[got[0]].shape)
                        kind = torch.float32 if cls.keeps_float32(got[0]) else DTYPES[dtype]
                        state[got[0]] = tensor.to(device=device, dtype=kind)
    if pairs is not None:
        pairs.check_done()
    if mxfp4 is not None:
        mxfp4.check_done(path)
    missing = [n for n in wanted if n not in state and not (tied and n == "lm_head.weight")]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint {path} is missing weights for {cls.__name__}: {missing[:5]}{more}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(wanted[name].shape):
            raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected {tuple(wanted[name].shape)}")
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.float32_head = float32_head
    model.fuse_projections()
    model.rope_to(device)
    model.eval()
    model.requires_grad_(False)
    return model, cfg


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(path))


def eos_token_ids(path: str | Path, cfg: Any, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """EOS ids from generation_config.json (what generate() stops on), else the config / tokenizer."""
    ids: set[int] = set()
    gen = Path(path) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if not ids:
        eos = getattr(cfg, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
