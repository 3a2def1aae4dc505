"""The worker host's log of its sequences: starts and failures under each request's correlation
id."""
from __future__ import annotations

import logging
from typing import Iterable

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.common.step_descriptors import StepResult

_LOG = logging.getLogger(__name__)


class SequenceLog:
    """Logs sequence starts and failures under the request's correlation id (the scheduler sends
    it once, in NewSequence); forgets a sequence when the scheduler finishes it."""

    def __init__(self) -> None:
        self._request_ids: dict[int, str] = {}

    def clear(self) -> None:
        self._request_ids.clear()

    def started(self, new_sequences: Iterable[worker_pb2.NewSequence]) -> None:
        for new in new_sequences:
            self._request_ids[new.seq_id] = new.request_id
            _LOG.info("sequence %d started (%d prompt tokens, %d from the prefix cache)", new.seq_id,
                      len(new.prompt_token_ids), new.num_cached_tokens,
                      extra={"request_id": new.request_id})

    def step_failed(self, request: worker_pb2.StepRequest, error: str) -> None:
        for row in request.rows:
            self._failed(row.seq_id, error)

    def ended(self, request: worker_pb2.StepRequest, result: StepResult) -> None:
        if result.error:
            self.step_failed(request, result.error)
        for row in result.results:
            if row.error:
                self._failed(row.seq_id, row.error)
        for seq_id in request.finished_seq_ids:
            self._request_ids.pop(seq_id, None)

    def _failed(self, seq_id: int, error: str) -> None:
        _LOG.warning("sequence %d failed: %s", seq_id, error,
                     extra={"request_id": self._request_ids.get(seq_id, "")})
