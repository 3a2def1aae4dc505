"""The drafter interface of speculative decoding: what the worker asks a draft model for.

A drafter proposes `num_drafts` tokens after the newest committed token of a sequence; the target
verifies them in one pass (runtime.py). It reads committed state only: `observe` is called with the
tap-layer outputs of committed positions, never of a rejected draft, and `release` frees everything
it keeps for a sequence on every exit path (finish, abort, preemption).

On a sharded layout the drafter's layers hold the rank's share of the model and run its
collectives, so every rank of a partition makes the same calls (all of them sample a speculative
row and know its verdict), and `propose` is called on every step of every rank — with no requests
when its partition drafts nothing — so the ranks of an expert-parallel group meet in the same
collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class DraftRequest:
    seq_id: int
    anchor_token: int  # the newest committed token: not yet in any cache
    anchor_pos: int  # its position
    num_drafts: int  # K


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # num_drafts proposals for positions anchor_pos+1 ...
    confidences: list[float]  # per token in [0, 1]


class Drafter(Protocol):
    tap_layer_ids: tuple[int, ...]  # target layers whose OUTPUTS the drafter reads (empty: none)

    def observe(self, seq_id: int, start_pos: int, taps: torch.Tensor) -> None:
        """Committed tokens only: taps [n, len(tap_layer_ids), D] = each tap layer's output
        averaged over the hc copies, for positions start_pos .. start_pos+n-1."""

    def propose(self, requests: list[DraftRequest]) -> list[Draft]: ...

    def release(self, seq_id: int) -> None: ...


@dataclass(frozen=True)
class StreamObservation:
    """Committed positions start_pos .. start_pos+n-1 of one sequence, for a `StreamDrafter`."""

    seq_id: int
    start_pos: int
    streams: torch.Tensor              # [n, hc, D]: the target's last-layer hc streams
    token_ids: list[int]               # the n tokens at those positions
    block_tables: dict[str, list[int]]  # the sequence's (the drafter may page its own cache)


@runtime_checkable
class StreamDrafter(Drafter, Protocol):
    """A drafter that reads the target's last-layer hc streams and the paged caches (MTP): the
    runtime calls `observe_streams` instead of `observe`, once per step with every chunk's
    committed positions (an empty list when there are none), because observing runs the
    drafter's own layer and its collectives."""

    def observe_streams(self, observations: list[StreamObservation]) -> None: ...
