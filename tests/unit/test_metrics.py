"""The metrics catalogue (issue 22 item 1, ADR 0061): every metric the platform defines is in
docs/operations.md's table, names follow Prometheus conventions, and :func:`metrics.serve` serves
the text format on a port it binds and stops cleanly; a malformed bind is refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from prometheus_client import Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from hypermedia.core import metrics
from hypermedia.jobs.gauges import PlatformCollector
from hypermedia.worker.gauges import WorkerCollector
from services.credits.gauges import HoldsCollector

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _defined() -> dict[str, str]:
    """Every metric name a scrape shows (counters with ``_total``) → its type."""
    names: dict[str, str] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            suffix = "_total" if isinstance(value, Counter) else ""
            names[value._name + suffix] = value._type
    collected = [
        *PlatformCollector(None, None, 60).describe(),
        *HoldsCollector(None, None).describe(),
        *WorkerCollector([]).collect(),
    ]
    for family in collected:
        names[family.name] = family.type
    return names


def test_every_metric_is_documented_with_its_type() -> None:
    table = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([a-z_]+)` \| (counter|gauge|histogram) \|", DOCS.read_text(), re.M)
    }
    defined = _defined()
    assert len(defined) >= 30
    assert {name: defined[name] for name in defined} == {name: table.get(name) for name in defined}
    assert not set(table) - set(defined), "documented but not defined"


def test_names_follow_the_conventions() -> None:
    for name, kind in _defined().items():
        assert re.fullmatch(r"(hypermedia|grpc_server)_[a-z_]+", name), name
        assert name.endswith("_total") == (kind == "counter"), name
    for value in vars(metrics).values():
        if isinstance(value, Histogram):
            assert value._name.endswith(("_seconds", "_bytes")), value._name


def test_serve_answers_the_text_format_and_stops() -> None:
    metrics.SANDBOX_KILLS.labels("seccomp").inc(0)
    port, stop = metrics.serve("127.0.0.1:0")
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=")
        assert 'hypermedia_sandbox_kills_total{reason="seccomp"}' in answer.text
    finally:
        stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.parametrize("bind", ["9464", "host:", "host:port", "127.0.0.1:70000", ""])
def test_a_malformed_bind_is_refused_by_name(bind: str) -> None:
    with pytest.raises(ValueError, match="must be host:port"):
        metrics.parse_bind(bind)


def test_ipv6_and_an_empty_host_bind() -> None:
    assert metrics.parse_bind("[::1]:9464") == ("::1", 9464)
    assert metrics.parse_bind(":9464") == ("0.0.0.0", 9464)


def test_error_code_and_method_labels_are_closed_sets() -> None:
    """Review finding: a sandbox child's report named the ``error_code`` label, and any method a
    client sent named ``method``: each unknown value is one more series."""
    assert metrics.job_error_label("CORRUPT_INPUT") == "CORRUPT_INPUT"
    assert metrics.job_error_label("PWN_b0d5") == "OTHER"
    assert metrics.method_label("GET") == "GET"
    assert metrics.method_label("PROPFIND") == "other"


def test_every_job_error_code_documented_or_raised_by_an_engine_is_a_label() -> None:
    api = (DOCS.parent / "api.md").read_text()
    table = api[api.index("### Job error codes") : api.index("## gRPC")]
    documented = {
        c
        for row in re.findall(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \|", table, re.M)
        for c in re.findall(r"[A-Z_]+", row)
    }
    root = DOCS.parent.parent / "hypermedia"
    raised = {
        code
        for folder in ("engines", "sandbox", "worker")
        for path in (root / folder).rglob("*.py")
        for code in re.findall(r'Error\([^()]*?,\s*"([A-Z][A-Z_]{3,})"\)', path.read_text(), re.S)
    }
    assert len(documented) > 25 and len(raised) > 15
    assert documented - metrics.JOB_ERROR_CODES == set()
    assert raised - metrics.JOB_ERROR_CODES == set()
