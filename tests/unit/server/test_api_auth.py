"""Who may call what: writes need the management token; reads that may show row values
need a read token or the management token; /health carries no row values; a foreign
Host header and an oversized body are refused before anything else."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.server.app import create_app

WRITES = [
    ("post", "/api/sinks/files/pause"),
    ("post", "/api/sinks/files/resume"),
    ("post", "/api/dead-letters/1/retry"),
    ("post", "/api/dead-letters/1/discard"),
    ("post", "/api/backfills/1/cancel"),
]


READS = [
    "/api/sources", "/api/sinks", "/api/sinks/files", "/api/dead-letters", "/api/dead-letters/1",
    "/api/parked", "/api/backfills", "/api/backfills/1",
]  # fmt: skip


def client(
    token: str | None,
    monkeypatch: pytest.MonkeyPatch,
    base_url: str = "http://127.0.0.1:8376",
    **server: object,
) -> TestClient:
    for var in ("WALSTREAM_API_TOKEN", "WALSTREAM_API_READ_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    cfg = parse_config({
        "server": {**({"token": token} if token else {}), **server},
        "sources": [{"name": "app", "dsn": "postgresql:///app", "slot": "s", "publication": "p"}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": "/tmp/unused"}}],
    })  # fmt: skip
    rt = Runtime(cfg)  # not started: no database, no Spark; the auth check comes first
    return TestClient(create_app(rt, rt.monitor, rt.metrics), base_url=base_url)


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_writes_are_disabled_without_a_token(monkeypatch, method, path) -> None:
    r = getattr(client(None, monkeypatch), method)(path, headers={"Authorization": "Bearer x"})
    assert r.status_code == 403
    assert "server.token" in r.json()["detail"]["fix"]


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_writes_need_the_bearer_token(monkeypatch, method, path) -> None:
    c = client("s3cret-token", monkeypatch)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"},
                    {"Authorization": "s3cret-token"}, {"Authorization": "Bearer s3cret-toke"}):  # fmt: skip
        r = getattr(c, method)(path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert "s3cret" not in r.text
    # The right token passes the check: the call then fails for want of a started runtime.
    r = getattr(c, method)(path, headers={"Authorization": "Bearer s3cret-token"})
    assert r.status_code == 503, r.text


def test_every_token_is_compared_in_constant_time(monkeypatch) -> None:
    """security.md: tokens are compared in constant time. The check hands each configured
    token to `hmac.compare_digest` (never `==`, whose time leaks how much of a guess is
    right), every one of them whichever matches, so the time does not say which matched."""
    import hmac

    from walstream.server import answers

    compared: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(answers.hmac, "compare_digest", recording)
    c = client("manage-token", monkeypatch, read_token="read-token")
    for given, status in (("manage-tokeX", 401), ("read-token", 200)):
        compared.clear()
        r = c.get("/api/sinks", headers={"Authorization": f"Bearer {given}"})
        assert r.status_code in (status, 503), r.text  # past the check: no runtime (503)
        assert sorted(compared) == sorted(
            [(given.encode(), b"read-token"), (given.encode(), b"manage-token")]
        )


def test_token_from_the_environment(monkeypatch) -> None:
    c = client(None, monkeypatch)
    monkeypatch.setenv("WALSTREAM_API_TOKEN", "from-env")
    assert c.post("/api/sinks/files/pause").status_code == 401
    r = c.post("/api/sinks/files/pause", headers={"Authorization": "Bearer from-env"})
    assert r.status_code == 503


def test_unknown_sink_is_404_with_the_known_ones(monkeypatch) -> None:
    c = client("t", monkeypatch)
    r = c.post("/api/sinks/nope/pause", headers={"Authorization": "Bearer t"})
    assert r.status_code == 404
    assert r.json()["detail"] == {"problem": "no sink named 'nope'", "fix": "sinks are: files"}


def test_openapi_documents_every_call(monkeypatch) -> None:
    spec = client(None, monkeypatch).get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {"/health", "/metrics", "/api/sinks", "/api/sources", "/api/dead-letters",
            "/api/dead-letters/{id}/retry", "/api/backfills", "/api/backfills/{id}/cancel",
            "/api/sinks/{name}/pause"} <= paths  # fmt: skip


@pytest.mark.parametrize("path", READS)
def test_reads_of_row_data_are_disabled_without_a_token(monkeypatch, path) -> None:
    r = client(None, monkeypatch).get(path, headers={"Authorization": "Bearer x"})
    assert r.status_code == 403
    assert "server.read_token" in r.json()["detail"]["fix"]


@pytest.mark.parametrize("path", READS)
def test_reads_take_the_read_token_or_the_management_token(monkeypatch, path) -> None:
    c = client("manage-token", monkeypatch, read_token="read-token")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic read-token"}):
        r = c.get(path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert "read-token" not in r.text and "manage-token" not in r.text
    for token in ("read-token", "manage-token"):
        r = c.get(path, headers={"Authorization": f"Bearer {token}"})
        # Past the check: the runtime is not started (503), or the sink lists come back.
        assert r.status_code in (200, 503), (token, r.text)


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_a_read_token_cannot_write(monkeypatch, method, path) -> None:
    c = client("manage-token", monkeypatch, read_token="read-token")
    r = getattr(c, method)(path, headers={"Authorization": "Bearer read-token"})
    assert r.status_code == 401


def test_health_metrics_and_the_console_stay_open(monkeypatch) -> None:
    c = client("manage-token", monkeypatch, read_token="read-token")
    assert c.get("/metrics").status_code == 200
    assert c.get("/").status_code == 200
    assert c.get("/health").status_code in (200, 503)


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8376", "127.0.0.1.evil.example", "localhost.", "10.0.0.5"],
)
def test_a_foreign_host_header_is_refused_before_anything_else(monkeypatch, host) -> None:
    """DNS rebinding: a page of another site reaching 127.0.0.1 still sends its own name."""
    c = client("manage-token", monkeypatch)
    for path in ("/health", "/api/sinks/files/pause", "/"):
        r = c.post(path, headers={"Host": host, "Authorization": "Bearer manage-token"})
        assert r.status_code == 400, (host, path)
        assert "server.allowed_hosts" in r.json()["detail"]["fix"]


@pytest.mark.parametrize("host", ["127.0.0.1:8376", "localhost:8376", "[::1]:8376", "LOCALHOST"])
def test_loopback_names_are_allowed(monkeypatch, host) -> None:
    c = client(None, monkeypatch)
    assert c.get("/metrics", headers={"Host": host}).status_code == 200


def test_allowed_hosts_is_configurable(monkeypatch) -> None:
    c = client(None, monkeypatch, allowed_hosts=["walstream.internal"])
    assert c.get("/metrics", headers={"Host": "walstream.internal:8376"}).status_code == 200
    assert c.get("/metrics", headers={"Host": "127.0.0.1:8376"}).status_code == 400
    anyone = client(None, monkeypatch, allowed_hosts=["*"])
    assert anyone.get("/metrics", headers={"Host": "whatever.example"}).status_code == 200
    bound = client(None, monkeypatch, host="10.1.2.3")  # the address it binds is allowed
    assert bound.get("/metrics", headers={"Host": "10.1.2.3:8376"}).status_code == 200


def test_bodies_are_limited_before_parsing_or_authentication(monkeypatch) -> None:
    c = client("manage-token", monkeypatch, max_body_bytes=1024)
    big = b'{"reason": "' + b"x" * 2000 + b'"}'
    # No token at all: the size is refused first (413, not 401).
    r = c.post("/api/sinks/files/pause", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "1,024 bytes" in r.json()["detail"]["problem"]

    def chunks():  # no Content-Length: the body streams in until it is too big
        for _ in range(10):
            yield b"x" * 500

    r = c.post("/api/sinks/files/pause", content=chunks())
    assert r.status_code == 413
    small = c.post("/api/sinks/files/pause", json={"reason": "x"})
    assert small.status_code == 401  # within the limit: on to authentication


def test_read_token_from_the_environment(monkeypatch) -> None:
    c = client(None, monkeypatch)
    assert c.get("/api/parked").status_code == 403  # no token at all: reads are off
    monkeypatch.setenv("WALSTREAM_API_READ_TOKEN", "read-from-env")
    assert c.get("/api/parked").status_code == 401
    assert (
        c.get("/api/parked", headers={"Authorization": "Bearer read-from-env"}).status_code == 503
    )
