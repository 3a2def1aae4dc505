"""Do the workers' handshakes describe one world? Pure checks over their descriptions."""
from __future__ import annotations

from typing import Optional

from services.scheduler.worker_description import WorkerDescription


def disagreement(described: list[tuple[str, WorkerDescription]]) -> Optional[tuple[str, str]]:
    """(address of the worker to refuse, why) when the workers do not form one world: another
    topology, other block groups, or ranks not covering the world exactly once; None when they do."""
    first_address, first = described[0]
    for address, description in described[1:]:
        if description.topology != first.topology:
            return address, (f"worker {address} refused: its topology {_topology(description)} "
                             f"differs from worker {first_address}'s {_topology(first)}")
        if description.block_groups != first.block_groups:
            return address, (f"worker {address} refused: its block groups "
                             f"{description.block_groups} differ from worker {first_address}'s "
                             f"{first.block_groups}")
    return _coverage(described)


def _coverage(described: list[tuple[str, WorkerDescription]]) -> Optional[tuple[str, str]]:
    owner: dict[int, str] = {}
    for address, description in described:
        for rank in description.host_ranks:
            if rank in owner:
                return address, (f"worker {address} refused: rank {rank} is also driven by "
                                 f"worker {owner[rank]} (each rank must have one worker)")
            owner[rank] = address
    world_size = described[0][1].topology.world_size
    missing = sorted(set(range(world_size)) - set(owner))
    if missing:
        return described[-1][0], (f"ranks {_ranges(missing)} of the {world_size}-rank world are "
                                  f"driven by no worker (--workers lists {len(described)})")
    return None


def needs_join(described: list[WorkerDescription]) -> bool:
    """A world spread over several workers is formed through JoinWorld (one worker driving the
    whole world forms it alone)."""
    return len(described) > 1 or described[0].host_ranks != tuple(
        range(described[0].topology.world_size))


def _topology(description: WorkerDescription) -> str:
    t = description.topology
    return f"dp{t.dp} tp{t.tp} ep{t.ep} on {t.backend}"


def _ranges(ranks: list[int]) -> str:
    return ",".join(map(str, ranks)) if len(ranks) < 6 else f"{ranks[0]}..{ranks[-1]}"
