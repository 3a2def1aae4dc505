"""The collectives of a sharded forward, and their single-rank identity.

Attention gathers along the hidden dimension inside the TP group (`tp_concat`). The MoE exchanges
tokens inside the EP group: every DP group's tokens go to every rank of the group once (sent by one
"contributor" rank per DP group, see `ParallelLayout.ep_contributor`), each rank applies its local
experts, and the per-(token, slot) expert outputs are summed over the EP group. Each output slot is
computed by exactly one rank and is zero elsewhere, so that sum is exact in any order — the MoE
result is bit-identical to the single-rank run.

Every rank of an EP group calls the expert collectives in every MoE layer of every step, with zero
tokens when its DP group has no rows (an idle group writes nothing, but the others need its
experts). `begin_step` exchanges the token counts once per step, so every rank knows every
contribution's size and the same ranks skip an exchange that carries no token at all.
"""
from __future__ import annotations

import time
from typing import Optional, Protocol

import torch
import torch.distributed as dist

from services.worker.model.parallel import ParallelLayout


class Collectives(Protocol):
    expert_parallel: bool

    def begin_step(self, num_tokens: int) -> None:
        """Called by every rank at the start of each forward with its DP group's token count."""
        ...

    def tp_concat(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, n] → [T, tp·n]: the TP ranks' pieces side by side in rank order."""
        ...

    def gather_expert_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, F] of this DP group → [N, F]: every contribution of the EP group, in rank order."""
        ...

    def reduce_expert_outputs(self, y: torch.Tensor) -> torch.Tensor:
        """y [N, ...] (this rank's experts' outputs, zero elsewhere) → the sum over the EP group,
        restricted to this DP group's T rows."""
        ...


class LocalCollectives:
    """One rank holds everything: every collective is the identity."""

    expert_parallel = False

    def begin_step(self, num_tokens: int) -> None:
        pass

    def tp_concat(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_expert_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def reduce_expert_outputs(self, y: torch.Tensor) -> torch.Tensor:
        return y


class DeferredCollectives:
    """The collectives of a rank that loads its weights before it joins a world (and may join a
    later one again): delegates to whatever `connect` set last (the identity until then)."""

    def __init__(self) -> None:
        self._inner: Collectives = LocalCollectives()

    def connect(self, inner: Collectives) -> None:
        self._inner = inner

    @property
    def connected(self) -> Collectives:
        return self._inner

    @property
    def expert_parallel(self) -> bool:
        return self._inner.expert_parallel

    def begin_step(self, num_tokens: int) -> None:
        self._inner.begin_step(num_tokens)

    def tp_concat(self, x: torch.Tensor) -> torch.Tensor:
        return self._inner.tp_concat(x)

    def gather_expert_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self._inner.gather_expert_inputs(x)

    def reduce_expert_outputs(self, y: torch.Tensor) -> torch.Tensor:
        return self._inner.reduce_expert_outputs(y)


class TorchCollectives:
    """torch.distributed collectives over the TP and EP groups of `layout` (gloo or NCCL)."""

    def __init__(self, layout: ParallelLayout, tp_group: Optional[dist.ProcessGroup],
                 ep_group: Optional[dist.ProcessGroup]) -> None:
        self._layout = layout
        self._tp_group = tp_group
        self._ep_group = ep_group
        self.expert_parallel = ep_group is not None
        self._counts: list[int] = []       # tokens each EP rank contributes this step
        self._own_offset = 0               # where this DP group's rows start in the gathered rows
        self._num_tokens = 0
        self.elapsed_ns = 0                # time spent inside collectives (benchmarks read it)

    @classmethod
    def create(cls, layout: ParallelLayout) -> "TorchCollectives":
        """Creates the groups. Every rank of the world must call this, in the same order."""
        tp_groups = _new_groups(layout.world_size, layout.tp)
        ep_groups = _new_groups(layout.world_size, layout.ep)
        tp_group = tp_groups[layout.partition_id] if layout.tp > 1 else None
        ep_group = ep_groups[layout.rank // layout.ep] if layout.ep > 1 else None
        return cls(layout, tp_group, ep_group)

    def begin_step(self, num_tokens: int) -> None:
        self._num_tokens = num_tokens
        if self._ep_group is None:
            return
        layout = self._layout
        contributes = layout.ep_contributor(layout.rank) == layout.rank
        mine = torch.tensor([num_tokens if contributes else 0], dtype=torch.int64)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(layout.ep)]
        self._timed(dist.all_gather, counts, mine, group=self._ep_group)
        self._counts = [int(c) for c in counts]
        contributor_index = layout.ep_contributor(layout.rank) % layout.ep
        self._own_offset = sum(self._counts[:contributor_index])

    def tp_concat(self, x: torch.Tensor) -> torch.Tensor:
        if self._tp_group is None:
            return x
        wire = _wire(x)
        pieces = [torch.empty_like(wire) for _ in range(self._layout.tp)]
        self._timed(dist.all_gather, pieces, wire, group=self._tp_group)
        return torch.cat(pieces, dim=-1).to(x.dtype)

    def gather_expert_inputs(self, x: torch.Tensor) -> torch.Tensor:
        if self._ep_group is None:
            return x
        largest = max(self._counts)
        if largest == 0:
            return x[:0]
        mine = self._counts[self._layout.ep_rank]
        wire = _wire(x)[:mine]
        padded = torch.cat([wire, wire.new_zeros(largest - mine, *wire.shape[1:])])
        pieces = [torch.empty_like(padded) for _ in range(self._layout.ep)]
        self._timed(dist.all_gather, pieces, padded, group=self._ep_group)
        rows = [piece[:count] for piece, count in zip(pieces, self._counts)]
        return torch.cat(rows).to(x.dtype)

    def reduce_expert_outputs(self, y: torch.Tensor) -> torch.Tensor:
        if self._ep_group is None:
            return y
        if y.shape[0]:
            self._timed(dist.all_reduce, y, group=self._ep_group)
        return y[self._own_offset:self._own_offset + self._num_tokens]

    def _timed(self, collective, *args, **kwargs) -> None:
        started = time.perf_counter_ns()
        collective(*args, **kwargs)
        self.elapsed_ns += time.perf_counter_ns() - started


def _new_groups(world_size: int, size: int) -> list[Optional[dist.ProcessGroup]]:
    """Consecutive groups of `size` ranks (None when size is 1: nothing to communicate)."""
    if size == 1:
        return [None] * world_size
    return [dist.new_group(list(range(first, first + size)))
            for first in range(0, world_size, size)]


def _wire(x: torch.Tensor) -> torch.Tensor:
    """What travels: contiguous, and fp32 for reduced-precision floats (gloo has no bf16 all-gather
    on every build; the round trip is exact)."""
    if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    return x.contiguous()
