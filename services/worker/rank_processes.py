"""A host's rank processes as handles: what exited and why, and the ways to end them."""
from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from services.worker.rank_messages import RankSpec, Shutdown

REAP_TIMEOUT_S = 5.0


@dataclass
class RankProcess:
    spec: RankSpec
    process: Any  # torch.multiprocessing SpawnProcess
    conn: Connection


def describe_exit(ranks: list[RankProcess]) -> str:
    """Which rank exited, with its exit code (or that a pipe closed)."""
    for rank in ranks:
        if wait([rank.process.sentinel], timeout=0):
            # The sentinel fires as the process closes its fds, just before it can be reaped.
            rank.process.join(REAP_TIMEOUT_S)
            return (f"rank {rank.spec.rank} (pid {rank.process.pid}) exited with code "
                    f"{rank.process.exitcode}")
    return "a rank closed its pipe"


def kill_all(ranks: list[RankProcess]) -> None:
    """SIGKILL every rank and reap it."""
    for rank in ranks:
        rank.process.kill()
    for rank in ranks:
        rank.process.join()


def stop_all(ranks: list[RankProcess], timeout_s: float) -> None:
    """Asks each rank to shut down; terminates, then kills, what is left after `timeout_s`."""
    for rank in ranks:
        try:
            rank.conn.send(Shutdown())
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
    for rank in ranks:
        rank.process.join(timeout_s)
        if rank.process.is_alive():
            rank.process.terminate()
            rank.process.join(timeout_s)
        if rank.process.is_alive():
            rank.process.kill()
            rank.process.join()
    for rank in ranks:
        rank.conn.close()
