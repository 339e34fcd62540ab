"""A hub id (`org/name`, optionally `org/name@revision`) as the checkpoint folder the local Hugging Face cache already
holds: rayscore never downloads, so `rayscore serve Qwen/Qwen3-8B` serves what `hf download` (or a volume, in a pod)
put in $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub. huggingface_hub's own offline lookup reads the
cache's layout (refs, snapshots), so a cache written by any of its versions resolves as it would for transformers."""

from __future__ import annotations

import re
from pathlib import Path

# What a hub repository id looks like (huggingface_hub's own rule: org/name of word characters, '.', '-'), so a
# mistyped local path is not looked up as one.
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


def looks_like_hub_id(model: str) -> bool:
    return bool(_HUB_ID.match(model)) and not model.startswith((".", "/", "~"))


def cached_snapshot(model: str) -> Path:
    """The local snapshot folder of hub id `model`; FileNotFoundError naming the cache searched when it is absent."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, _, revision = model.partition("@")
    try:
        folder = snapshot_download(repo_id, revision=revision or None, local_files_only=True)
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"model {model!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}); rayscore does not "
            f"download: fetch it first (e.g. `hf download {repo_id}`) or pass a checkpoint folder") from e
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model {model!r}: the cached snapshot {path} has no config.json (an incomplete "
                                "download?)")
    return path
