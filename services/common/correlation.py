"""One correlation id per request, carried frontend → scheduler → worker and put in every log line.

The frontend takes the client's `X-Request-Id` header when it is a plain token (so ids from a load
balancer or the client's own tracing join up), otherwise it uses the response id (`chatcmpl-…`). It
sends the id to the scheduler as gRPC metadata `x-request-id`; the scheduler hands it to the worker
in `NewSequence.request_id`. Anything that is not a short plain token is dropped, never logged: a log
line must not be forgeable through a header.
"""
from __future__ import annotations

import re
from typing import Optional

METADATA_KEY = "x-request-id"
HTTP_HEADER = "X-Request-Id"
MAX_LENGTH = 128
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]*")


def valid_request_id(text: Optional[str]) -> Optional[str]:
    """`text` when it is a usable correlation id (1–128 of `A-Z a-z 0-9 . _ : -`), else None."""
    if text is None or len(text) > MAX_LENGTH or _TOKEN.fullmatch(text) is None:
        return None
    return text


def from_metadata(metadata: Optional[tuple[tuple[str, str], ...]]) -> Optional[str]:
    """The valid `x-request-id` among gRPC invocation metadata, if any."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            return valid_request_id(value if isinstance(value, str) else None)
    return None
