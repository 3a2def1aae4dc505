"""Errors shared by the frontend libraries.

`RequestError` is raised by any frontend library that rejects an OpenAI request body (bad messages,
content parts, tools, ...). The app turns it into an OpenAI error object (HTTP `status`) using `message`,
`param` (the JSON path of the offending field, e.g. ``messages[2].content[1].type``) and `code`.
"""
from __future__ import annotations

from typing import Optional


class RequestError(Exception):
    """A client error in the request → HTTP `status` (400 unless a subclass says otherwise)."""

    status = 400

    def __init__(self, message: str, param: Optional[str] = None,
                 code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __repr__(self) -> str:
        return f"RequestError(message={self.message!r}, param={self.param!r}, code={self.code!r})"


class ConstraintError(RequestError):
    """The request asks for a constraint the grammar cannot express, or one over the server's
    bounds → HTTP 400 naming the tool, the schema keyword or the limit."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message, param, "invalid_request_error")
