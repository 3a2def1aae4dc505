"""Failures the scheduler reports to a caller, as plain exceptions with a status kind.

The kinds mirror the gRPC status codes the Scheduler contract promises; only `server.py` turns them
into `grpc.StatusCode`s, so the step loop and the policy never import grpc.
"""
from __future__ import annotations

import enum
from typing import Optional


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"      # the request can never be served as asked
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # the cache cannot hold it (now or ever)
    UNAVAILABLE = "UNAVAILABLE"                # no (complete) set of workers
    INTERNAL = "INTERNAL"                      # our bug, reported for one request only


class SchedulerError(Exception):
    """A request-level failure: `kind` picks the status, the message is shown to the client.
    `retry_after_s`: a refusal the caller may retry after that long (back-pressure)."""

    def __init__(self, kind: ErrorKind, message: str, retry_after_s: Optional[int] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s


class WorkerLost(Exception):
    """The workers cannot run steps any more; the message says which worker and why."""
