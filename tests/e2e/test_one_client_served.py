"""One client against everyone else, on the real server (Serve's proxy, the ingress, a SmolLM2 worker) on the
session's local Ray cluster, all on 127.0.0.1: hundreds of connections that trickle their headers or their bodies,
idle keep-alive connections, header values no decoder accepts, and fan-outs larger than a worker's queue; other
clients are answered throughout, exactly, and nothing that can never succeed is answered 503."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import torch
from ray import serve

from tests.helpers.reference import hf_logits, hf_scores
from tests.helpers.serve import app_args, deploy, ids_of, score_body

APP, PREFIX = "slow", "/slow"
BODY_TIMEOUT_S = 4.0
SLOW_HEADERS, SLOW_BODIES = 150, 150
ATOL = 1e-4


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    deploy(APP, PREFIX, app_args(num_workers=1, body_timeout_s=BODY_TIMEOUT_S))
    yield serve_url + PREFIX
    serve.delete(APP)


def _address(url: str) -> tuple[str, int]:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.split(":")
    return host, int(port)


def _open(url: str) -> socket.socket:
    s = socket.create_connection(_address(url), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return s


def _answer(s: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or `timeout` passes)."""
    return _read_until_closed(s, timeout)[0]


def _read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What the server sends, and whether it closed the connection within `timeout`."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def test_hundreds_of_slow_connections_do_not_stop_other_clients(url: str, smollm2_path) -> None:
    ids = ids_of(40, 3)
    expected = hf_scores(smollm2_path, ids, 0)
    path = PREFIX + "/generate"
    slow_headers = [_open(url) for _ in range(SLOW_HEADERS)]
    for s in slow_headers:  # headers that never end
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".encode())
    slow_bodies = [_open(url) for _ in range(SLOW_BODIES)]
    for s in slow_bodies:  # whole headers, then a body that never ends
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: 4000\r\n\r\n{{\"input_ids\": [".encode())
    stop = threading.Event()

    def trickle() -> None:  # one more byte a second on every slow connection, as a slowloris client does
        while not stop.wait(1.0):
            for s in slow_headers + slow_bodies:
                try:
                    s.send(b"1")
                except OSError:
                    pass

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    answered = []
    try:
        deadline = time.monotonic() + BODY_TIMEOUT_S + 4
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < deadline:
                start = time.monotonic()
                assert client.get(url + "/health").status_code == 200
                r = client.post(url + "/generate", json=score_body(ids, 0))
                assert r.status_code == 200, r.text
                rows = r.json()["meta_info"]["input_token_logprobs"]
                assert [t for _, t in rows] == ids[1:]
                assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
                answered.append(time.monotonic() - start)
        # The slow bodies were cut at body_timeout_s: 408, and the connection closed.
        answers = [_answer(s, 10) for s in slow_bodies]
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}
        assert b"body_timeout_s" in answers[0]
    finally:
        stop.set()
        t.join(5)
        for s in slow_headers + slow_bodies:
            s.close()
    assert len(answered) >= 3, answered  # clients were answered throughout, not once the slow ones were cut


def test_an_idle_keep_alive_connection_is_closed(url: str) -> None:
    s = _open(url)
    s.sendall(f"GET {PREFIX}/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    # The proxy's keep_alive_timeout_s (5 s, as in configs/*.yaml) closes it; Serve's default would wait 90 s.
    rest, closed = _read_until_closed(s, 30)
    assert closed and b"HTTP/1.1" not in rest and 4 <= time.monotonic() - started < 25
    s.close()


# Header values rayscore reads (or that reach it untouched): never a 5xx.
HOSTILE = [(b"Authorization", b"Bearer \xff"), (b"Authorization", b"\xff" * 3000), (b"Content-Type", b"\xff/json"),
           (b"Content-Length", b"\xff"), (b"X-Request-ID", b"a" * 5000), (b"X-Request-ID", b"\x7f\x01"),
           (b"x-request-timeout-seconds", b"-1"), (b"x-request-timeout-seconds", b"nan"), (b"Accept", b"\xff"),
           (b"X-Anything", b"\xc3\x28")]
# Header values Serve's own proxy decodes as UTF-8 before rayscore sees the request (Ray 2.60's proxy.py and
# http_util.py): a value that is not UTF-8 makes *the proxy* answer 500 "Internal Server Error" (text/plain); no
# application code runs, and nothing rayscore can configure changes it (docs/operating.md, Reliability). What we
# hold it to: the proxy answers (it does not hang or die) and every other client is still served.
SERVE_DECODED = [(b"X-Request-ID", b"\xff\xfe"), (b"x-session-id", b"\xc3\x28"),
                 (b"serve_multiplexed_model_id", b"\xff"), (b"x-request-timeout-seconds", b"\xff")]
ROUTES = [("POST", "/generate"), ("POST", "/v1/completions"), ("GET", "/health"), ("GET", "/v1/models"),
          ("POST", "/tokenize")]


def _raw(url: str, method: str, route: str, name: bytes, value: bytes) -> tuple[int | None, bytes]:
    body = b'{"input_ids": [1, 2, 3], "max_tokens": 0, "return_logprob": true}' if method == "POST" else b""
    s = _open(url)
    length = b"" if name == b"Content-Length" else f"Content-Length: {len(body)}\r\n".encode()
    head = f"{method} {PREFIX}{route} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".encode() + length
    s.sendall(head + name + b": " + value + b"\r\n\r\n" + body)
    answer = _answer(s, 60)
    s.close()
    return (int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None), answer


@pytest.mark.parametrize(("name", "value"), SERVE_DECODED, ids=lambda v: repr(v)[:30])
def test_header_values_serve_cannot_decode_leave_the_service_up(url: str, name: bytes, value: bytes) -> None:
    for method, route in ROUTES:
        status, answer = _raw(url, method, route, name, value)
        assert status is not None, answer[:300]  # answered, not hung up on
        assert status < 500 or answer.endswith(b"\r\n\r\nInternal Server Error"), answer[:300]
    assert httpx.get(url + "/health", timeout=30).status_code == 200


@pytest.mark.parametrize(("name", "value"), HOSTILE, ids=lambda v: repr(v)[:30])
def test_hostile_header_values_get_no_5xx_on_any_route(url: str, name: bytes, value: bytes) -> None:
    for method, route in ROUTES:
        status, answer = _raw(url, method, route, name, value)
        assert status is not None and status < 500, (method, route, answer[:300])
    # and the server still answers
    assert httpx.get(url + "/health", timeout=30).status_code == 200


def test_a_score_fan_out_is_admitted_as_one_unit(url: str, smollm2_path) -> None:
    """30 labels of an 1,800-token query: 54,000 queued tokens one by one, above max_queued_tokens (32,768), so
    each label past the 18th was refused 503 + Retry-After on an idle server; as one unit the query counts once."""
    query, labels = ids_of(1800, 21), list(range(100, 130))
    r = httpx.post(url + "/v1/score", json={"query": query, "items": [[]], "label_token_ids": labels}, timeout=600)
    assert r.status_code == 200, r.text
    expected = torch.log_softmax(hf_logits(smollm2_path, query), dim=-1)[-1, labels].exp().tolist()
    assert max(abs(a - b) for a, b in zip(r.json()["scores"][0], expected, strict=True)) <= ATOL


def test_a_batch_that_can_never_be_queued_is_400_not_503(url: str) -> None:
    items = [ids_of(2000, 100 + i) for i in range(20)]  # 40,000 distinct tokens > max_queued_tokens on any worker
    r = httpx.post(url + "/generate", json={"input_ids": items, "max_tokens": 0, "return_logprob": True,
                                           "logprob_start_len": 1998}, timeout=600)
    assert r.status_code == 400 and "Retry-After" not in r.headers, r.text
    assert "max_queued_tokens" in r.json()["message"] and "can never be admitted" in r.json()["message"]
    assert httpx.get(url + "/health", timeout=30).status_code == 200
