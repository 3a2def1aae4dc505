"""The OpenAI-compatible gateway: Starlette routes in front of the scheduler.

Per request: validate → render and tokenize (in a worker thread: a long prompt takes tens to
hundreds of ms) → `Scheduler.Generate` → wait for `admitted` before sending any header, so admission
errors are plain JSON → `responses.AdmittedGeneration` writes the body or the SSE stream.
A client disconnect (while waiting for admission, for a whole body, or mid-stream) cancels the gRPC
call, which aborts the request in the scheduler.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from services.common.build_info import build_id
from services.common.config import FrontendConfig
from services.frontend.auth import ApiKeyMiddleware
from services.frontend.errors import RequestError
from services.frontend.gateway import Gateway, PreparedPrompt
from services.frontend.openai_request import (parse_chat_request, parse_completion_request,
                                              parse_detokenize_request, parse_tokenize_request)
from services.frontend.openapi import openapi_document
from services.frontend.request_body import decode_json_object, read_body
from services.frontend.response_bodies import ResponseHeader, error_body, new_response_id
from services.frontend.scheduler_client import SchedulerClient
from services.frontend.scheduler_errors import RequestTimedOut, SchedulerError
from services.frontend.metrics import CONTENT_TYPE
from services.frontend.serving import RequestIdMiddleware
from services.frontend.tokenizer import Dsv4Tokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")

HEALTH_TIMEOUT_S = 2.0
METRICS_TIMEOUT_S = 1.0


class ClientDisconnected(Exception):
    """The client went away before its response was ready; the scheduler call is cancelled."""


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def _json_body(request: Request) -> dict[str, Any]:
    bounds = _gateway(request).config.bounds
    return decode_json_object(await read_body(request, bounds.max_request_body_bytes),
                              bounds.max_json_depth)


async def chat_completions(request: Request) -> Response:
    gw = _gateway(request)
    timer = gw.metrics.timer()
    chat = parse_chat_request(await _json_body(request), gw.limits)
    info = await gw.model_info()
    prompt = await anyio.to_thread.run_sync(gw.prepare_chat, chat.body, info.max_model_len)
    header = ResponseHeader(new_response_id("chatcmpl"), gw.config.served_model_name)
    generation = await _unless_disconnected(
        request, gw.admit(header, prompt, chat.params, timer, request.state.request_id))
    if chat.params.stream:
        return _sse_response(generation.chat_events(prompt.thinking, chat.tools,
                                                    chat.params.include_usage))
    body = await _unless_disconnected(request, generation.chat_body(prompt.thinking, chat.tools))
    return JSONResponse(body)


async def completions(request: Request) -> Response:
    gw = _gateway(request)
    timer = gw.metrics.timer()
    completion = parse_completion_request(await _json_body(request), gw.limits)
    params = completion.params
    token_ids = completion.prompt
    max_model_len = (await gw.model_info()).max_model_len
    if isinstance(token_ids, str):
        token_ids = await anyio.to_thread.run_sync(gw.encode_text_prompt, token_ids, True,
                                                   max_model_len)
    elif len(token_ids) > max_model_len:
        raise RequestError(f"The prompt has {len(token_ids)} token ids; max_model_len is "
                           f"{max_model_len}.", "prompt")
    header = ResponseHeader(new_response_id("cmpl"), gw.config.served_model_name)
    generation = await _unless_disconnected(
        request, gw.admit(header, PreparedPrompt(token_ids), params, timer, request.state.request_id))
    if params.stream:
        return _sse_response(generation.text_events(params.include_usage))
    return JSONResponse(await _unless_disconnected(request, generation.text_body()))


async def models(request: Request) -> Response:
    info = await _gateway(request).model_info()
    card = {"id": info.served_model_name, "object": "model", "created": 0, "owned_by": "dsv4serve",
            "root": info.served_model_name, "max_model_len": info.max_model_len}
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request) -> Response:
    if _gateway(request).draining:
        return JSONResponse({"status": "unavailable", "reason": "shutting down"}, status_code=503)
    try:
        readiness = await _gateway(request).scheduler.check_ready(HEALTH_TIMEOUT_S)
    except SchedulerError as error:
        return JSONResponse({"status": "unavailable",
                             "reason": f"scheduler did not answer: {error}"}, status_code=503)
    workers = [{"address": w.address, "connected": w.connected, "error": w.error,
                "last_ok_age_ms": w.last_ok_age_ms} for w in readiness.workers]
    if not readiness.ready:
        return JSONResponse({"status": "unavailable", "reason": readiness.reason or "not ready",
                             "workers": workers}, status_code=503)
    return JSONResponse({"status": "ok", "workers": workers})


async def tokenize(request: Request) -> Response:
    gw = _gateway(request)
    parsed = parse_tokenize_request(await _json_body(request), gw.limits)
    info = await gw.model_info()
    if parsed.chat_body is not None:
        tokens = await anyio.to_thread.run_sync(gw.encode_chat_prompt, parsed.chat_body,
                                                info.max_model_len)
    else:
        tokens = await anyio.to_thread.run_sync(gw.encode_text_prompt, parsed.prompt,
                                                parsed.add_special_tokens, info.max_model_len)
    return JSONResponse({"count": len(tokens), "max_model_len": info.max_model_len,
                         "tokens": tokens, "token_strs": None})


async def detokenize(request: Request) -> Response:
    gw = _gateway(request)
    token_ids = parse_detokenize_request(await _json_body(request), gw.limits)
    return JSONResponse({"prompt": await anyio.to_thread.run_sync(gw.tokenizer.decode, token_ids)})


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


async def metrics(request: Request) -> Response:
    gw = _gateway(request)
    try:
        snapshot = await gw.scheduler.get_scheduler_state(METRICS_TIMEOUT_S)
    except SchedulerError:
        snapshot = None
    return Response(gw.metrics.render(snapshot), media_type=CONTENT_TYPE)


def _sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`; if the client disconnects first, cancels it and raises `ClientDisconnected`."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
        await asyncio.gather(work_task, watch_task, return_exceptions=True)
    if work_task.cancelled():
        raise ClientDisconnected()
    return work_task.result()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error_response(status: int, message: str, error_type: str, param: Optional[str] = None,
                    code: Optional[str] = None) -> JSONResponse:
    return JSONResponse(error_body(message, error_type, param, code), status_code=status)


async def _on_request_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, RequestError)
    return _error_response(error.status, error.message, "invalid_request_error", error.param,
                           error.code)


async def _on_scheduler_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, SchedulerError)
    status = error.http_status
    if not error.after_admission:  # after admission the generation counted its own ending
        _count_refusal(_gateway(request), error)
    log.info("request refused (%d): %s", status, error.message,
             extra={"request_id": request.state.request_id})
    error_type = {400: "invalid_request_error", 503: "service_unavailable",
                  504: "timeout"}.get(status, "server_error")
    response = _error_response(status, error.message, error_type, None, error.code.name.lower())
    if error.retry_after_s is not None:
        response.headers["Retry-After"] = str(error.retry_after_s)
    return response


def _count_refusal(gw: Gateway, error: SchedulerError) -> None:
    if isinstance(error, RequestTimedOut):
        gw.metrics.count_timeout()
    elif error.retry_after_s is not None and not gw.draining:
        gw.metrics.count_rejected("queue_full")


async def _on_http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return _error_response(error.status_code, str(error.detail), "invalid_request_error")


async def _on_disconnect(request: Request, error: Exception) -> Response:
    return Response(status_code=499)


async def _on_bug(request: Request, error: Exception) -> Response:
    log.exception("internal error serving %s", request.url.path)
    return _error_response(500, f"internal server error: {type(error).__name__}", "server_error")


def create_app(config: FrontendConfig, scheduler_client: Optional[SchedulerClient] = None,
               tokenizer: Optional[Dsv4Tokenizer] = None) -> Starlette:
    """The app; loads config.json and the tokenizer (unless given: it takes seconds) now.

    Without `scheduler_client` the lifespan connects to `config.scheduler_address` inside the
    serving event loop, as grpc.aio requires.
    """
    gateway = Gateway(config, scheduler_client, tokenizer)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.open()
        try:
            yield
        finally:
            await gateway.close()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        RequestError: _on_request_error, SchedulerError: _on_scheduler_error,
        HTTPException: _on_http_error, ClientDisconnected: _on_disconnect,
        ClientDisconnect: _on_disconnect, Exception: _on_bug}
    middleware = [Middleware(RequestIdMiddleware)]
    if config.api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=config.api_key,
                                     exempt_paths=config.auth_exempt_paths))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                    middleware=middleware)
    app.state.gateway = gateway
    app.state.openapi = openapi_document("dsv4serve", build_id())
    return app
