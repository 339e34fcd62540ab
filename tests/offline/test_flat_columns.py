"""rayscore-batch's --flat-logprobs: the compact columns of a row decode (protocol/compact.py, as an HTTP answer
does) to exactly the values and top-k the plain columns hold, bit for bit; a row in error has nulls in both."""

from __future__ import annotations

import struct

from offline.columns import result_columns
from offline.dataset_scorer import RowResult
from protocol import compact


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_flat_columns_decode_to_the_plain_columns():
    rows = [RowResult(num_tokens=4, token_logprobs=[f32(-1.1), f32(-0.2), f32(-3.3)],
                      top_logprobs=[[(f32(-0.1), 5), (f32(-0.9), 7)]] * 3),
            RowResult(error="engine: too long")]
    plain = {k: v.to_pylist() for k, v in result_columns(rows, 2, False).items()}
    flat = {k: v.to_pylist() for k, v in result_columns(rows, 2, False, flat=True).items()}
    assert "token_logprobs" not in flat and "top_logprobs" not in flat
    first = {k: v[0] for k, v in flat.items()}
    values = compact.unpack_values(first["token_logprobs_val_flat_b64"])
    assert [struct.pack("<d", v) for v in values] == [struct.pack("<d", v) for v in plain["token_logprobs"][0]]
    assert first["token_logprobs_shape"] == [3] and first["top_logprobs_shape"] == [3, 2]
    assert compact.decode_top_rows(first, "top_logprobs") == [
        [[e["logprob"], e["token_id"]] for e in row] for row in plain["top_logprobs"][0]]
    assert flat["token_logprobs_val_flat_b64"][1] is None and flat["error"][1] == "engine: too long"
    assert flat["sum_logprob"] == plain["sum_logprob"]
