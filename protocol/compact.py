"""The compact encoding of logprob answers: flat arrays of little-endian float32 values and int32 token ids, base64
text in JSON, with their shapes; SGLang's names (`<field>_val_flat_b64`, `<field>_idx_flat_b64`, `<field>_shape`,
`<field>_null_prefix`, `<field>_val_flat_b64_dtype`: "float32" / `<field>_idx_flat_b64_dtype`: "int32").

Why: a 2,048-token sequence at top-20 is ~80k JSON numbers, each printed as ~18 decimal characters and parsed back;
the same values as bytes are 4 each and cost a copy. Values the engine computes are float32, so float32 carries them
bit for bit (the JSON answer writes the same float32 value as a double); a value computed in float64 after the engine
(/v1/score's probabilities) is written as float64, and its dtype marker says so.

Pure (no torch, no web framework): every route of the ingress and rayscore-batch call the same functions. Decoding is
documented in docs/vllm.md (ten lines of numpy) and here (`decode_*`, used by the tests and the bench).
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Any

Fields = dict[str, Any]
_LITTLE = sys.byteorder == "little"


def _b64(a: array) -> str:
    if not _LITTLE:
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def pack_values(values: Sequence[float], dtype: str = "float32") -> str:
    """Base64 of the values as little-endian float32 ("float32") or float64 ("float64")."""
    return _b64(array("f" if dtype == "float32" else "d", values))


def pack_ids(ids: Sequence[int]) -> str:
    """Base64 of the ids as little-endian int32 (token ids and ranks fit: vocabularies are far below 2**31)."""
    return _b64(array("i", ids))


def unpack_values(text: str, dtype: str = "float32") -> list[float]:
    a = array("f" if dtype == "float32" else "d")
    a.frombytes(base64.b64decode(text))
    if not _LITTLE:
        a.byteswap()
    return a.tolist()


def unpack_ids(text: str) -> list[int]:
    a = array("i")
    a.frombytes(base64.b64decode(text))
    if not _LITTLE:
        a.byteswap()
    return a.tolist()


def flat_values(name: str, values: Sequence[float], shape: Sequence[int], dtype: str = "float32") -> Fields:
    """One flat array of values with its shape: `<name>_val_flat_b64`, `<name>_shape`, the dtype marker."""
    return {f"{name}_val_flat_b64": pack_values(values, dtype), f"{name}_val_flat_b64_dtype": dtype,
            f"{name}_shape": list(shape)}


def flat_ids(name: str, ids: Sequence[int], suffix: str = "idx") -> Fields:
    """One flat array of int32: `<name>_<suffix>_flat_b64` and its dtype marker (the shape is the values')."""
    return {f"{name}_{suffix}_flat_b64": pack_ids(ids), f"{name}_{suffix}_flat_b64_dtype": "int32"}


def encode_token_rows(name: str, rows: Sequence[Sequence[Any]] | None, null_prefix: int = 0) -> Fields:
    """[[value, token_id, ...], ...] (one entry per position) -> values [n] and ids [n]; null_prefix: positions
    before the first row that have none (OpenAI's null first prompt token), written as `<name>_null_prefix`.
    None (not requested) stays None, as the JSON answer's field."""
    if rows is None:
        return {f"{name}_val_flat_b64": None}
    out = flat_values(name, [r[0] for r in rows], [len(rows)])
    out.update(flat_ids(name, [r[1] for r in rows]))
    if null_prefix:
        out[f"{name}_null_prefix"] = null_prefix
    return out


def encode_top_rows(name: str, rows: Sequence[Sequence[Sequence[Any]]] | None, null_prefix: int = 0) -> Fields:
    """Per position, [[value, token_id, ...] x k] -> values and ids [n, k], row-major. Rows of unequal length (a
    position with fewer entries) also give `<name>_row_lengths_flat_b64` (int32 [n]) and k is the longest row; the
    flat arrays then hold the rows back to back, unpadded."""
    if rows is None:
        return {f"{name}_val_flat_b64": None}
    lengths = [len(r) for r in rows]
    k = max(lengths, default=0)
    out = flat_values(name, [e[0] for r in rows for e in r], [len(rows), k])
    out.update(flat_ids(name, [e[1] for r in rows for e in r]))
    if any(n != k for n in lengths):
        out.update(flat_ids(name, lengths, suffix="row_lengths"))
    if null_prefix:
        out[f"{name}_null_prefix"] = null_prefix
    return out


def decode_token_rows(fields: Fields, name: str) -> list[list[Any]] | None:
    """The inverse of encode_token_rows: [[value, token_id], ...] (None when the field was None)."""
    if fields.get(f"{name}_val_flat_b64") is None:
        return None
    vals = unpack_values(fields[f"{name}_val_flat_b64"], fields[f"{name}_val_flat_b64_dtype"])
    ids = unpack_ids(fields[f"{name}_idx_flat_b64"])
    return [[v, t] for v, t in zip(vals, ids, strict=True)]


def decode_top_rows(fields: Fields, name: str) -> list[list[list[Any]]] | None:
    """The inverse of encode_top_rows: per position, [[value, token_id] x k]."""
    if fields.get(f"{name}_val_flat_b64") is None:
        return None
    vals = unpack_values(fields[f"{name}_val_flat_b64"], fields[f"{name}_val_flat_b64_dtype"])
    ids = unpack_ids(fields[f"{name}_idx_flat_b64"])
    n, k = fields[f"{name}_shape"]
    lengths = (unpack_ids(fields[f"{name}_row_lengths_flat_b64"]) if f"{name}_row_lengths_flat_b64" in fields
               else [k] * n)
    out, at = [], 0
    for length in lengths:
        out.append([[v, t] for v, t in zip(vals[at:at + length], ids[at:at + length], strict=True)])
        at += length
    return out
