"""API-key authentication of the gateway, OpenAI style: `Authorization: Bearer <key>`.

An ASGI middleware in front of every route: a request to a path outside `exempt_paths` without
the right key gets 401 with an OpenAI error body before any route (or body read) runs. The key is
compared by SHA-256 digest with `hmac.compare_digest`, so the time taken does not depend on how
much of a guess is right, nor on the guess's length.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.frontend.response_bodies import error_body

UNAUTHORIZED = error_body("Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                          "invalid_request_error", None, "invalid_api_key")


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, exempt_paths: Iterable[str]) -> None:
        self.app = app
        self._key_digest = hashlib.sha256(api_key.encode()).digest()
        self._exempt = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._exempt or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(UNAUTHORIZED, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        presented = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                presented = token.strip() if scheme.lower() == b"bearer" else b""
        return hmac.compare_digest(hashlib.sha256(presented).digest(), self._key_digest)
