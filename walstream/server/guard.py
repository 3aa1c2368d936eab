"""What every request passes before the API sees it: an allowed Host, a bounded body.

An ASGI middleware, so both checks come before routing, parsing and authentication:

- **Host allow-list.** A browser page on another site can make a name of its own
  resolve to 127.0.0.1 (DNS rebinding) and then call the API as a same-origin page;
  its requests still carry that name in `Host`, so any name not in the list is
  refused (400). Default: loopback names and the address the server binds.
- **Body limit.** A body over the limit is refused with 413 — by its Content-Length
  at once, or while it streams in (chunked) — before any of it is parsed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def host_name(header: str) -> str:
    """`Host` without its port, lowercase: "[::1]:8376" -> "::1", "Example.com:80" -> "example.com"."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


class Guard:
    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None, max_body: int) -> None:
        self.app = app
        self.hosts = hosts  # None: any host
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and host_name(host) not in self.hosts:
            await _refuse(
                send,
                400,
                f"the Host header {host[:100]!r} is not one this server answers to",
                "call it by an allowed name, or add the name to server.allowed_hosts",
            )
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_body
            except ValueError:
                await _refuse(send, 400, "the Content-Length header is not a number", None)
                return
            if too_big:
                await _refuse(send, 413, *self._too_big())
                return
            await self.app(scope, receive, send)
            return
        if headers.get(b"transfer-encoding") is None:
            await self.app(scope, receive, send)
            return
        # A streamed body: read it (up to the limit) before the API sees any of it.
        chunks: list[Message] = []
        size = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_body:
                await _refuse(send, 413, *self._too_big())
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)

    def _too_big(self) -> tuple[str, str]:
        return (
            f"the request body is over {self.max_body:,} bytes",
            "send a smaller body (server.max_body_bytes sets the limit)",
        )


async def _refuse(send: Send, status: int, problem: str, fix: str | None) -> None:
    detail = {"problem": problem, "fix": fix} if fix else {"problem": problem}
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
