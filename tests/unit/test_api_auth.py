"""The API's write calls: disabled without a token, 401 without or with a wrong one."""

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


def client(token: str | None, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.delenv("WALSTREAM_API_TOKEN", raising=False)
    cfg = parse_config({
        "server": {"token": token} if token else {},
        "sources": [{"name": "app", "dsn": "postgresql:///app", "slot": "s", "publication": "p"}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": "/tmp/unused"}}],
    })  # fmt: skip
    rt = Runtime(cfg)  # not started: no database, no Spark; the auth check comes first
    return TestClient(create_app(rt, rt.monitor, rt.metrics))


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
