"""What the host process and its rank processes say to each other over their pipes.

Host → rank: `StepPlan` (every rank gets every plan), `StepMasks` (partition leaders, after a plan
whose masks follow; read while that step runs), `JoinWorld`, `ResetSequences`, `Shutdown`.
Rank → host: `RankLoaded` once its weights are in, `RankJoined` once it joined a world round and
warmed up, `RankFailed` when it cannot, and a `StepResult` per plan from partition leaders only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from services.common.config import SpeculativeConfig
from services.common.step_descriptors import StepMasks, StepPlan
from services.worker.sequence_state import PartitionLimits
from services.worker.model.parallel import ParallelLayout


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank process needs to come up."""

    layout: ParallelLayout
    dist_backend: str  # "gloo" or "nccl"
    device: str  # "cpu" or "cuda:N"
    store_host: str  # the world's TCPStore (served by the host process that drives rank 0)
    store_port: int
    model_dir: Path
    dtype: str  # "float32" or "bfloat16"
    limits: PartitionLimits
    torch_threads: int = 1  # intra-op threads on CPU
    # Join this world round right after loading (a worker that drives the whole world forms it
    # alone); None: wait for a JoinWorld command.
    join_round: Optional[int] = None
    collective_timeout_s: float = 120.0
    speculative: Optional[SpeculativeConfig] = None  # the drafter the rank builds

    @property
    def rank(self) -> int:
        return self.layout.rank


@dataclass(frozen=True)
class JoinWorld:
    """(Re)join the world as round `round`: a new process group under a round-specific prefix of
    the store, then a warm-up step that every rank of the world runs together."""

    round: int


@dataclass(frozen=True)
class ResetSequences:
    """Drop every sequence: a new Step stream starts empty."""


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class RankLoaded:
    rank: int


@dataclass(frozen=True)
class RankJoined:
    rank: int
    round: int


@dataclass(frozen=True)
class RankFailed:
    rank: int
    error: str


RankCommand = Union[StepPlan, StepMasks, JoinWorld, ResetSequences, Shutdown]
