"""The image side of the ingress: decoding a client's image bytes and preprocessing them with the served model's
image processor (transformers' AutoImageProcessor over the model folder's preprocessor_config.json), loaded once per
ingress replica, like the tokenizer (ingress/text.py).

Everything here is synchronous and CPU-bound (a 4-megapixel JPEG takes tens of milliseconds): the routes call it
through asyncio.to_thread, so the event loop keeps answering other requests, and the engine's thread never sees an
image, only its patches (protocol/images.py). Every limit is checked before the work it bounds: the pixel count from
the image's header before its pixels are decoded, the image count before any is opened.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any

from ingress.errors import InvalidRequest, enforce
from protocol import ImageData, ModelInfo, expand_runs
from protocol.images import placeholder_runs
from rulebook import images as img

DATA_URL_HEAD = "data:image/"


@dataclass(frozen=True)
class ImageLimits:
    """The ingress settings' image limits (IngressSettings)."""

    max_images_per_request: int
    max_image_pixels: int
    # allow_image_urls, and what bounds a fetch: max_request_bytes, body_timeout_s.
    allow_urls: bool = False
    max_bytes: int = 4 * 1024 * 1024
    timeout_s: float = 30.0


@dataclass(frozen=True)
class ImageBlob:
    """One image as a client sent it: its bytes (or the http(s) URL to fetch them from), where in the body it was
    (messages, image_data) for the messages."""

    data: bytes
    where: str
    param: str
    url: str | None = None


def from_data_url(url: str, where: str, param: str) -> ImageBlob:
    """An OpenAI `image_url.url`: `data:image/<type>;base64,<bytes>`, or an http(s) URL (fetched only with
    allow_image_urls: prepare_images)."""
    if url.startswith(("http://", "https://")):
        return ImageBlob(b"", where, param, url=url)
    head, sep, payload = url.partition(",")
    if not (url.startswith(DATA_URL_HEAD) and sep and head.endswith(";base64")):
        raise InvalidRequest(img.NOT_DATA_URL.format(where=where, value=img.quote(url)), param=param)
    return ImageBlob(_b64(payload, where, param), where, param)


def from_image_data(value: str, where: str, param: str) -> ImageBlob:
    """An SGLang `image_data` entry: a data: URL, the image's base64, or an http(s) URL (SGLang's file path is
    never read)."""
    if value.startswith(("data:", "http://", "https://")):
        return from_data_url(value, where, param)
    if value.startswith(("file:", "/", ".")):
        raise InvalidRequest(img.NOT_AN_IMAGE_SOURCE.format(where=where, value=img.quote(value)), param=param)
    return ImageBlob(_b64(value, where, param), where, param)


def _b64(payload: str, where: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(img.BAD_BASE64.format(where=where, value=payload[:img.QUOTE_CHARS]),
                             param=param) from exc


def image_limits(settings: Any) -> ImageLimits:
    """The image limits of an IngressSettings."""
    return ImageLimits(settings.max_images_per_request, settings.max_image_pixels, settings.allow_image_urls,
                       settings.max_request_bytes, settings.body_timeout_s)


def _fetched(blob: ImageBlob, limits: ImageLimits) -> ImageBlob:
    """A URL blob's bytes, read in this thread, at most max_bytes of them, within timeout_s per read."""
    import httpx

    if blob.url is None:
        return blob
    value = img.quote(blob.url)
    data = bytearray()
    try:
        with httpx.stream("GET", blob.url, timeout=limits.timeout_s, follow_redirects=True) as r:
            r.raise_for_status()
            for part in r.iter_bytes():
                data += part
                if len(data) > limits.max_bytes:
                    raise InvalidRequest(img.FETCH_TOO_LARGE.format(where=blob.where, value=value,
                                                                    limit=limits.max_bytes), param=blob.param)
    except httpx.HTTPError as exc:
        reason = type(exc).__name__
        if isinstance(exc, httpx.HTTPStatusError):
            reason = f"HTTP {exc.response.status_code}"
        raise InvalidRequest(img.FETCH_FAILED.format(where=blob.where, value=value, reason=reason),
                             param=blob.param) from exc
    return ImageBlob(bytes(data), blob.where, blob.param)


def vision_ids(info: ModelInfo) -> tuple[int, ...]:
    """What a chat template's image is in ids: vision start, one placeholder, vision end (expanded after)."""
    ids = (info.vision_start_token_id, info.image_token_id, info.vision_end_token_id)
    return tuple(i for i in ids if i is not None)


def expanded(ids: list[int], images: list[ImageData], info: ModelInfo, param: str) -> list[int]:
    """`ids` with each image's placeholder run expanded to its token count; a 400 when the runs and the images
    differ in number (a text-only request's ids pass unchanged)."""
    if not images and (info.image_token_id is None or info.image_token_id not in ids):
        return ids
    token_id = info.image_token_id if info.image_token_id is not None else -1
    try:
        return expand_runs(ids, [im.num_tokens for im in images], token_id)
    except ValueError as exc:
        runs = len(placeholder_runs(ids, token_id))
        raise InvalidRequest(img.PLACEHOLDERS.format(runs=runs, token_id=token_id, images=len(images)),
                             param=param) from exc


class ImageSide:
    """One ingress replica's image processor. `prepare` is synchronous: call it through asyncio.to_thread."""

    def __init__(self, info: ModelInfo) -> None:
        from PIL import Image
        from transformers import AutoImageProcessor

        # max_image_pixels replaces PIL's own bomb check (a warning above 89 Mpx, an error with no size in it above
        # twice that): ours runs on the header too, and its 400 names the limit and the image's size.
        Image.MAX_IMAGE_PIXELS = None
        if not info.model_path:
            raise RuntimeError("The worker reported no model folder: the ingress cannot load the image processor.")
        # The PIL processor: no torchvision on the serving path (the fast one needs it).
        self.processor: Any = AutoImageProcessor.from_pretrained(info.model_path, backend="pil")

    def prepare(self, blobs: list[ImageBlob], limits: ImageLimits) -> list[ImageData]:
        """Each image decoded, checked and preprocessed, in order; InvalidRequest (400) names the first broken
        limit."""
        return [self._one(_fetched(blob, limits), limits) for blob in blobs]

    def _one(self, blob: ImageBlob, limits: ImageLimits) -> ImageData:
        import numpy as np
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(blob.data))  # reads the header only
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise InvalidRequest(img.UNDECODABLE.format(where=blob.where, reason="no image format recognised"),
                                 param=blob.param) from exc
        enforce(img.too_many_pixels(blob.where, image.width, image.height, limits.max_image_pixels, blob.param))
        enforce(img.unsupported_format(blob.where, image.format, blob.param))
        try:
            rgb = image.convert("RGB")  # decodes (a truncated or corrupt body fails here)
        except (OSError, ValueError, SyntaxError) as exc:
            raise InvalidRequest(img.UNDECODABLE.format(where=blob.where, reason=img.quote(str(exc))),
                                 param=blob.param) from exc
        out = self.processor(images=[rgb], return_tensors="np")
        pixels = np.ascontiguousarray(out["pixel_values"], dtype="<f4")
        t, h, w = (int(x) for x in out["image_grid_thw"][0])
        return ImageData.of(pixels.tobytes(), int(pixels.shape[0]), int(pixels.shape[1]), (t, h, w))


async def prepare_images(side: ImageSide, blobs: list[ImageBlob], limits: ImageLimits,
                         param: str) -> list[ImageData]:
    """The images of one request, off the event loop; the count is checked before any is opened."""
    enforce(img.too_many(len(blobs), limits.max_images_per_request, param))
    for blob in blobs:  # no fetch starts unless the operator allows them
        if blob.url is not None and not limits.allow_urls:
            raise InvalidRequest(img.NOT_DATA_URL.format(where=blob.where, value=img.quote(blob.url)),
                                 param=blob.param)
    return await asyncio.to_thread(side.prepare, blobs, limits) if blobs else []
