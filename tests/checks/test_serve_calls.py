"""checks/serve_calls.py on a Prometheus page as Ray's metrics agent writes it (the served check is
tests/e2e/test_worker_calls_served.py): the worker calls of one app are split by the route of the request context
they were made in, errors count as calls, other deployments and apps do not."""

from __future__ import annotations

from pathlib import Path

from checks import serve_calls

CALLS, ERRORS, HTTP = serve_calls.CALLS[0], serve_calls.CALLS[1], serve_calls.HTTP


def _line(name: str, value: float, **labels: str) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" + f" {value}"


PAGE = "\n".join([
    f"# TYPE {CALLS} counter",
    _line(CALLS, 10.0, application="calls", deployment="EngineWorker", replica="calls#EngineWorker#a", route="/calls"),
    _line(CALLS, 5.0, application="calls", deployment="EngineWorker", replica="calls#EngineWorker#b", route="/calls"),
    _line(CALLS, 3.0, application="calls", deployment="EngineWorker", replica="calls#EngineWorker#a", route=""),
    _line(CALLS, 14.0, application="calls", deployment="Ingress", replica="calls#Ingress#c", route="/calls"),
    _line(CALLS, 99.0, application="other", deployment="EngineWorker", replica="other#EngineWorker#d", route="/o"),
    _line(ERRORS, 1.0, application="calls", deployment="EngineWorker", exception_type="CancelledError",
          replica="calls#EngineWorker#a", route="/calls"),
    _line(HTTP, 13.0, application="calls", method="POST", route="/calls", status_code="200"),
    _line(HTTP, 1.0, application="calls", method="POST", route="/calls", status_code="400"),
    _line(HTTP, 7.0, application="other", method="POST", route="/o", status_code="200"),
]) + "\n"


def test_counts_split_request_calls_from_the_replicas_own(tmp_path: Path) -> None:
    page = tmp_path / "metrics"
    page.write_text(PAGE)
    got = serve_calls.counts(serve_calls.scrape(page.as_uri()), "calls")
    assert got == serve_calls.Counts(request_calls=16, other_calls=3, http_requests=14)
    assert got.minus(serve_calls.Counts(10, 1, 10)) == serve_calls.Counts(6, 2, 4)
    assert serve_calls.counts(serve_calls.scrape(page.as_uri()), "calls", "Ingress").request_calls == 14


def test_settled_waits_for_the_proxys_count(tmp_path: Path) -> None:
    page = tmp_path / "metrics"
    page.write_text(PAGE)
    assert serve_calls.settled(page.as_uri(), "calls", 0.1, http_requests=14).http_requests == 14
    try:
        serve_calls.settled(page.as_uri(), "calls", 0.1, http_requests=15, timeout_s=1.5)
    except TimeoutError as exc:
        assert "still moving" in str(exc)
    else:
        raise AssertionError("settled returned before the proxy counted the requests")


def test_the_bound_routes_come_first() -> None:
    names = list(serve_calls.routes("m", "some text", [1, 2, 3]))
    assert names[:4] == list(serve_calls.BOUND)
    assert serve_calls.routes("m", "t", [1])[serve_calls.BOUND[1]][1]["stream"] is True
