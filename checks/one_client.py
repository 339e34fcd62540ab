"""The `abuse` part of `python -m bench reliability`: what one client with valid-looking requests could do to
everyone else, each case against the running server while a prober sends a known scoring request and
GET /health every 0.5 s. Per case: the status codes, the answer's size, the time; for the run: the prober's
failures and its slowest answer, and whether the known request's rows are the same afterwards.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

SLOW_CONNECTIONS = 300  # half trickle their headers, half their bodies


class Prober:
    """A second client that keeps asking for a known scoring request and /health while the cases run."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.url, self.body = url, body
        self.failures: list[str] = []
        self.slowest_s = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as c:
            while not self._stop.wait(0.5):
                t0 = time.perf_counter()
                try:
                    h = c.get(self.url + "/health")
                    r = c.post(self.url + "/generate", json=self.body)
                    if h.status_code != 200 or r.status_code != 200:
                        self.failures.append(f"{h.status_code}/{r.status_code}")
                except httpx.HTTPError as e:
                    self.failures.append(type(e).__name__)
                self.slowest_s = max(self.slowest_s, time.perf_counter() - t0)
                self.answers += 1

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


def _timed(fn: Callable[[], httpx.Response]) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = fn()
    return {"status": r.status_code, "answer_bytes": len(r.content), "s": round(time.perf_counter() - t0, 2)}


def _slow_connections(url: str, path: str, hold_s: float) -> dict[str, Any]:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    socks = []
    for i in range(SLOW_CONNECTIONS):
        s = socket.create_connection((host, int(port)), timeout=30)
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
        s.sendall((head + "X-Slow: " if i % 2 else head + "Content-Length: 4000\r\n\r\n{\"input_ids\": [").encode())
        socks.append(s)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:  # one byte a second each, as a slowloris client sends
        for s in socks:
            try:
                s.send(b"1")
            except OSError:
                pass
        time.sleep(1.0)
    got_408 = 0
    for s in socks[::2]:
        s.settimeout(5)
        try:
            got_408 += s.recv(64).startswith(b"HTTP/1.1 408")
        except OSError:
            pass
    for s in socks:
        s.close()
    return {"connections": SLOW_CONNECTIONS, "held_s": hold_s, "slow_bodies_answered_408": got_408,
            "slow_bodies": len(socks[::2])}


def _raw_header(url: str, path: str, name: bytes, value: bytes) -> int | None:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    body = b'{"input_ids": [1, 2, 3], "max_tokens": 0, "return_logprob": true}'
    with socket.create_connection((host, int(port)), timeout=60) as s:
        kind = b"" if name.lower() == b"content-type" else b"Content-Type: application/json\r\n"
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
                  .encode() + kind + name + b": " + value + b"\r\n\r\n" + body)
        answer = s.recv(64)
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def abuse(url: str, prefix: str, ids_of: Callable[[int, int], list[int]], body_timeout_s: float,
          queued: Callable[[], int] | None) -> dict[str, Any]:
    """Every case; `queued` reads the workers' queued-token count (None without Ray)."""
    known = {"input_ids": ids_of(64, 7), "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
    cases: dict[str, Any] = {}
    with httpx.Client(timeout=600) as c:
        before = c.post(url + "/generate", json=known).json()["meta_info"]["input_token_logprobs"]
        with Prober(url, known) as prober:
            long_ids = ids_of(4000, 1)
            twice = {"input_ids": [long_ids, long_ids], "rid": ["x", "x"], "max_tokens": 0, "return_logprob": True,
                     "logprob_start_len": 0}
            reused = [_timed(lambda: c.post(url + "/generate", json=twice)) for _ in range(10)]
            cases["reused_rid_x10"] = {"statuses": sorted({r["status"] for r in reused}),
                                       "queued_tokens_after": queued() if queued else None}
            cases["echo_50000_bad_items"] = _timed(lambda: c.post(url + "/generate", json={"input_ids": [""] * 50000}))
            cases["tokenize_3_9_MB"] = _timed(lambda: c.post(url + "/tokenize", json={"prompt": "ab " * 1_300_000}))
            cases["completions_text_3_9_MB"] = _timed(lambda: c.post(url + "/v1/completions", json={
                "prompt": "ab " * 1_300_000, "max_tokens": 1}))
            cases["batch_300_tiny_items"] = _timed(lambda: c.post(url + "/generate", json={
                "input_ids": [[5, 6]] * 300, "max_tokens": 1}))
            cases["score_1800_query_x_30_labels"] = _timed(lambda: c.post(url + "/v1/score", json={
                "query": ids_of(1800, 2), "items": [[]], "label_token_ids": list(range(100, 130))}))
            cases["batch_20_x_2000_distinct"] = _timed(lambda: c.post(url + "/generate", json={
                "input_ids": [ids_of(2000, 50 + i) for i in range(20)], "max_tokens": 0, "return_logprob": True,
                "logprob_start_len": 1998}))
            cases["stop_600k_strings"] = _timed(lambda: c.post(url + "/generate", json={
                "input_ids": [1, 2], "max_tokens": 4, "stop": ["ab"] * 600_000}))
            surrogate = '{"input_ids": [1, 2], "max_tokens": 1, "rid": "\\ud800", "model": "\\udfff"}'
            cases["lone_surrogates"] = _timed(lambda: c.post(url + "/generate", content=surrogate,
                                                             headers={"content-type": "application/json"}))
            cases["non_utf8_text_body"] = _timed(lambda: c.post(url + "/tokenize", content=b"\xff\xfe\x00",
                                                                headers={"content-type": "text/plain"}))
            cases["chat_without_max_tokens"] = _timed(lambda: c.post(url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": None}))
            # The last is decoded by Serve's own proxy, which answers a non-UTF-8 value with 500 (docs/operating.md).
            cases["hostile_headers"] = {f"{name.decode()}: {value[:8]!r}": _raw_header(
                url, prefix.rstrip("/") + "/generate", name, value) for name, value in [
                    (b"Authorization", b"Bearer \xff"), (b"X-Request-ID", b"a" * 5000),
                    (b"Content-Type", b"\xff/json"), (b"X-Request-ID", b"\xff\xfe")]}
            cases["slow_connections"] = _slow_connections(url, prefix.rstrip("/") + "/generate", body_timeout_s + 2)
        after = c.post(url + "/generate", json=known).json()["meta_info"]["input_token_logprobs"]
    # Warm (prefix cache) vs cold rows agree within rounding, not bit for bit, outside batch-invariant mode.
    diff = max((abs(a[0] - b[0]) if a[0] is not None and b[0] is not None else 0.0 if a[0] == b[0] else 1.0)
               for a, b in zip(before, after, strict=True))
    return {"cases": cases, "prober_answers": prober.answers, "prober_failures": prober.failures,
            "prober_slowest_s": round(prober.slowest_s, 2), "known_rows_max_diff_after": diff,
            "known_rows_same_after": diff <= 1e-4,
            "case_statuses": json.dumps({k: v.get("status") for k, v in cases.items() if isinstance(v, dict)})}
