"""How the API answers: problem details, the bearer check, parked messages and backfills."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from fastapi import HTTPException, Request

from walstream.delivery.parking import Parked
from walstream.secrets import scrub, scrub_json
from walstream.sinks.base import url_for_messages


def problem(status: int, detail: str, fix: str | None = None) -> HTTPException:
    """An HTTP error whose body says the problem and, when there is one, the fix."""
    return HTTPException(status, {"problem": detail, "fix": fix} if fix else {"problem": detail})


def check_bearer(request: Request, token: str | list[str], what: str) -> None:
    """401 unless the request carries `Authorization: Bearer <token>` with the token (or
    one of the tokens), compared in constant time."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    given = value.strip().encode()
    tokens = [token] if isinstance(token, str) else token
    matches = [hmac.compare_digest(given, t.encode()) for t in tokens]  # each one, always
    if scheme.lower() != "bearer" or not any(matches):
        raise HTTPException(
            401,
            {"problem": f"missing or wrong {what}", "fix": "send Authorization: Bearer <token>"},
            headers={"WWW-Authenticate": "Bearer"},
        )


def parked_json(p: Parked, secrets: Iterable[str], full: bool = False) -> dict[str, Any]:
    """A parked message or dead letter as the API shows it (errors without secrets)."""
    secrets = list(secrets)
    errors = scrub_json(p.errors, secrets)
    last = errors[-1]["error"] if errors else None
    out: dict[str, Any] = {
        "id": p.id,
        "sink": p.sink,
        "status": p.status,
        "group": p.group,
        "lsn": p.lsn,
        "seq": p.seq,
        "table": p.message.table,
        "action": p.message.action,
        "attempts": p.attempts,
        "last_error": last,
        "next_attempt_at": p.next_attempt_at.isoformat() if p.next_attempt_at else None,
        "created_at": p.created_at.isoformat(),
    }
    if full:
        value, key = p.message.value, p.message.key
        route = p.message.route
        if route is not None and route.startswith(("http://", "https://")):
            route = url_for_messages(route)  # a webhook URL's path can be its secret
        out.update(
            key=key.decode(errors="replace") if key is not None else None,
            route=route,
            idempotency_key=p.message.idempotency_key,
            errors=errors,
            message=value.decode(errors="replace") if value is not None else None,
        )
    return out


def backfill_json(b: Any, secrets: Iterable[str]) -> dict[str, Any]:
    return {
        "id": b.id,
        "sink": b.sink,
        "source": b.source,
        "table": b.qualified,
        "where": b.where,
        "status": b.status,
        "error": scrub(b.error, secrets) if b.error else None,
        "rows_read": b.rows_read,
        "rows_estimated": b.rows_estimated,
        "chunks": b.chunks,
        "chunks_delivered": b.chunks_emitted,
        "chunk_size": b.chunk_size,
        "rate_per_second": round(b.rate, 1) if b.rate is not None else None,
        "eta_seconds": round(b.eta, 1) if b.eta is not None else None,
        "created_at": b.created_at.isoformat(),
        "finished_at": b.finished_at.isoformat() if b.finished_at else None,
    }
