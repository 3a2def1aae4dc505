"""A failed scheduler call as the gateway sees it: `SchedulerError` carries the HTTP status to
answer with, so the app never inspects gRPC status codes itself."""
from __future__ import annotations

from typing import Optional

import grpc

# Trailing metadata of a back-pressure refusal (the scheduler's server.RETRY_AFTER_KEY).
RETRY_AFTER_KEY = "retry-after-s"

_HTTP_STATUS_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 400,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 503,
}


class SchedulerError(Exception):
    """A failed scheduler call.

    `http_status`: before admission 400 for a refused request (INVALID_ARGUMENT, RESOURCE_EXHAUSTED),
    503 when the scheduler is unreachable, 500 otherwise. After admission nothing is the client's
    fault: a lost worker or a request stalled under cache pressure is 503, anything else 500.
    `retry_after_s`: set on back-pressure refusals (the client gets it as `Retry-After`).
    """

    def __init__(self, code: grpc.StatusCode, message: str, after_admission: bool = False,
                 retry_after_s: Optional[int] = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.after_admission = after_admission
        self.retry_after_s = retry_after_s

    @property
    def http_status(self) -> int:
        status = _HTTP_STATUS_BY_CODE.get(self.code, 500)
        return 503 if self.after_admission and status == 400 else status

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError,
                       after_admission: bool = False) -> "SchedulerError":
        return cls(error.code(), error.details() or "", after_admission,
                   _retry_after_s(error.trailing_metadata()))


class RequestTimedOut(SchedulerError):
    """The generation passed the frontend's `--request-timeout-s`: 504 (the scheduler freed it)."""

    def __init__(self, timeout_s: float, after_admission: bool) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"the request did not finish within the server's request timeout of "
                         f"{timeout_s:g}s", after_admission)

    @property
    def http_status(self) -> int:
        return 504


def _retry_after_s(metadata: Optional[tuple]) -> Optional[int]:
    for key, value in metadata or ():
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return int(value)
    return None
