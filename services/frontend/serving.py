"""The gateway's process: uvicorn with a graceful stop, and the request-id middleware.

Graceful stop (SIGTERM/SIGINT): uvicorn closes the listening socket and lets open connections
finish; on top of that the gateway refuses new generations (503) and reports /health 503 at once,
and when `--shutdown-grace-s` has passed it cuts off every generation still running: a stream gets
an SSE error event and `[DONE]`, a non-stream request a 503 error body, and the scheduler frees them
(their calls are cancelled). uvicorn's own deadline is a few seconds later, so those endings are
written before it cancels anything.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from types import FrameType
from typing import TYPE_CHECKING, Optional

import uvicorn
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import correlation
from services.common.config import FrontendConfig

if TYPE_CHECKING:
    from services.frontend.app import Gateway

log = logging.getLogger(__name__)

# Time after the cut-off for the error events to be written before uvicorn cancels what is left.
CUT_OFF_FLUSH_S = 5.0


class RequestIdMiddleware:
    """Every HTTP request gets a correlation id: the client's `X-Request-Id` when it is a plain
    token, a fresh one otherwise. Routes read it as `request.state.request_id`; every response
    carries it back in `X-Request-Id`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(correlation.HTTP_HEADER.lower().encode(), b"")
        request_id = correlation.valid_request_id(sent.decode("latin-1")) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[correlation.HTTP_HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose exit signal also starts the gateway's drain and its cut-off timer."""

    def __init__(self, config: uvicorn.Config, gateway: "Gateway", grace_s: float) -> None:
        super().__init__(config)
        self._gateway = gateway
        self._grace_s = grace_s
        self._cut_off: Optional[asyncio.TimerHandle] = None

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        super().handle_exit(sig, frame)
        if self._cut_off is None:  # runs in the loop's thread (a signal.signal handler)
            loop = asyncio.get_event_loop()
            self._gateway.begin_shutdown()
            log.info("stopping: new requests are refused; running ones have %gs to finish",
                     self._grace_s)
            self._cut_off = loop.call_later(self._grace_s, self._gateway.cut_off_live)


async def serve(config: FrontendConfig) -> None:
    """Serves the gateway with uvicorn on the running loop (the CLI runs it under uvloop)."""
    from services.frontend.app import create_app

    app = create_app(config)
    grace_s = config.ops.shutdown_grace_s
    server_config = uvicorn.Config(app, host=config.host, port=config.port, log_config=None,
                                   timeout_graceful_shutdown=grace_s + CUT_OFF_FLUSH_S)
    await GracefulServer(server_config, app.state.gateway, grace_s).serve()
