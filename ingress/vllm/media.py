"""vLLM's image inputs (rulebook/vllm_media.py) as the blobs every dialect decodes (ingress/images.py): a chat
content part's image, and the token-in route's content_parts. Parsing only; decoding runs in prepare_images."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ingress.errors import InvalidRequest
from ingress.images import ImageBlob, from_data_url
from rulebook import images as img
from rulebook import vllm_media as vm


def part_image(url: Any, uuid: str | None, where: str, param: str) -> ImageBlob:
    """An image part's URL: `{"url": ...}` (OpenAI's form, a pydantic model or a dict) or the URL itself (vLLM's)."""
    if url is not None and not isinstance(url, str):
        url = url.get("url") if isinstance(url, Mapping) else getattr(url, "url", None)
    if url is None and uuid is not None:
        raise InvalidRequest(vm.UUID_ONLY.format(where=where), param=param)
    if not isinstance(url, str):
        raise InvalidRequest(img.NOT_DATA_URL.format(where=where, value=img.quote(url)), param=param)
    return from_data_url(url, where, param)


def content_part_blobs(parts: list[Any] | None) -> list[ImageBlob]:
    """The token-in route's content_parts, in order: each an `image_url` part; anything else a 400 naming it (vLLM
    skips an unknown type silently, which would leave a placeholder run without its image)."""
    blobs: list[ImageBlob] = []
    for i, part in enumerate(parts or []):
        where = f"content_parts[{i}]"
        if not isinstance(part, Mapping):
            raise InvalidRequest(vm.PART_SHAPE.format(where=where, got=type(part).__name__), param="content_parts")
        for key in part:
            if key not in vm.CONTENT_PART_KEYS:
                raise InvalidRequest(vm.PART_KEY.format(where=where, key=img.quote(key)), param="content_parts")
        kind = part.get("type")
        if kind != "image_url":
            raise InvalidRequest(vm.PART_TYPE.format(where=where, kind=img.quote(kind)), param="content_parts")
        uuid = part.get("uuid")
        blobs.append(part_image(part.get("url"), None if uuid is None else str(uuid), where, "content_parts"))
    return blobs
