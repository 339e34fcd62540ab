"""The rules of image input and their messages, written once (every dialect that takes images uses them).

Pure: the ingress decodes and checks images (ingress/images.py) and calls these with what it found. Every message
names the limit (an IngressSettings field) and quotes at most QUOTE_CHARS of what the client sent: an image is
megabytes, and a message lands in every log that records it.
"""

from __future__ import annotations

from rulebook.rules import Violation

# Most characters of a client's value a message quotes.
QUOTE_CHARS = 32
# What PIL decodes here and the processors take; anything else (SVG, PDF, TIFF, ICO, ...) is refused by name.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")

NO_IMAGES_HERE = ("The served model takes no images, and this request has {n}. Send text only, or serve a "
                  "vision-language model (docs/multimodal.md).")
TOO_MANY = "The request has {n} images; max_images_per_request is {limit}."
UNDECODABLE = "The {where} is not an image this server can decode ({reason})."
FORMAT = "The {where} is a {fmt} image; the formats this server decodes are {formats}."
TOO_MANY_PIXELS = ("The {where} is {width} x {height} = {pixels} pixels; max_image_pixels is {limit} (checked from "
                   "the image's header, before it is decoded).")
NOT_DATA_URL = ("The {where} must be a `data:image/...;base64,` URL; got {value!r}. Remote URLs are not fetched by "
                "this server (allow_image_urls is off): send the image's bytes in a data: URL.")
NOT_AN_IMAGE_SOURCE = ("The {where} must be a `data:image/...;base64,` URL, base64 bytes or an http(s) URL; got "
                       "{value!r} (files on the server are never read).")
FETCH_FAILED = "The {where} could not be fetched from {value!r} ({reason})."
FETCH_TOO_LARGE = "The {where} at {value!r} is over max_request_bytes ({limit} bytes)."
BAD_BASE64 = "The {where} is not valid base64 ({value!r}...)."
PLACEHOLDERS = ("The prompt has {runs} image placeholder runs (token id {token_id}) for {images} images: give one "
                "run per image, in order.")
IMAGE_CONTEXT = ("The prompt is {prompt_len} tokens once its {images} images are expanded ({image_tokens} image "
                 "tokens); with max_tokens {max_tokens} it exceeds the model's context length {context_len}.")


def quote(value: object) -> str:
    """At most QUOTE_CHARS of a client's value: what a message may say of it."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."


def too_many(n: int, limit: int, param: str) -> Violation | None:
    return Violation(TOO_MANY.format(n=n, limit=limit), param) if n > limit else None


def no_images_here(n: int, takes_images: bool, param: str) -> Violation | None:
    return Violation(NO_IMAGES_HERE.format(n=n), param) if n and not takes_images else None


def too_many_pixels(where: str, width: int, height: int, limit: int, param: str) -> Violation | None:
    if width * height <= limit:
        return None
    return Violation(TOO_MANY_PIXELS.format(where=where, width=width, height=height, pixels=width * height,
                                            limit=limit), param)


def unsupported_format(where: str, fmt: str | None, param: str) -> Violation | None:
    if fmt in IMAGE_FORMATS:
        return None
    return Violation(FORMAT.format(where=where, fmt=fmt or "unknown", formats=", ".join(IMAGE_FORMATS)), param)


def image_context(prompt_len: int, image_tokens: list[int], max_tokens: int, context_len: int,
                  param: str) -> Violation | None:
    if prompt_len + max_tokens <= context_len:
        return None
    return Violation(IMAGE_CONTEXT.format(prompt_len=prompt_len, images=len(image_tokens),
                                          image_tokens=sum(image_tokens), max_tokens=max_tokens,
                                          context_len=context_len), param)
