"""The life of one rank process: load its share of the model, join the world, execute commands.

A rank loads its weights first (the slow part), reports `RankLoaded`, and joins a world round when
told (or at once, when its worker forms the world alone). Joining creates a process group under a
round-specific prefix of the world's TCPStore, connects the model's collectives and runs a warm-up
step together with every other rank, so a later round (after another worker restarted) can be
joined without reloading. A rank ignores SIGINT (its host decides when to stop) and exits when its
pipe closes, so a host that dies never leaves ranks behind.
"""
from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Protocol

import torch
import torch.distributed as dist

from services.common.step_descriptors import StepMasks, StepPlan, StepResult
from services.worker.executor import AwaitMasks, PartitionExecutor, StepRuntime
from services.worker.model.collectives import Collectives, DeferredCollectives, TorchCollectives
from services.worker.rank_messages import (JoinWorld, RankCommand, RankFailed, RankJoined,
                                           RankLoaded, RankSpec, ResetSequences, Shutdown)

_STORE_TIMEOUT = timedelta(seconds=120)


class RuntimeBuilder(Protocol):
    def build(self, spec: RankSpec, collectives: Collectives) -> StepRuntime: ...


def rank_main(spec: RankSpec, factory: RuntimeBuilder, conn: Connection) -> None:
    """Entry point of a rank process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    collectives = DeferredCollectives()
    try:
        executor = _load(spec, factory, collectives)
    except Exception as error:  # reported to the host, which decides what to do
        conn.send(RankFailed(spec.rank, f"{type(error).__name__}: {error}"))
        _exit_now(1)
    conn.send(RankLoaded(spec.rank))
    if spec.join_round is not None and not _join(spec, spec.join_round, executor, collectives,
                                                 conn):
        _exit_now(1)
    _execute_commands(spec, conn, executor, collectives)
    if dist.is_initialized():
        dist.destroy_process_group()
    _exit_now(0)


def _exit_now(code: int) -> None:
    """Skips interpreter teardown, which takes seconds once torch is loaded; the rank holds nothing
    that needs it (its results went through the pipe)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _load(spec: RankSpec, factory: RuntimeBuilder,
          collectives: Collectives) -> PartitionExecutor:
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device))
    else:
        torch.set_num_threads(spec.torch_threads)
    return PartitionExecutor(factory.build(spec, collectives), spec.limits)


def _join(spec: RankSpec, round_: int, executor: PartitionExecutor,
          collectives: DeferredCollectives, conn: Connection) -> bool:
    """Join world round `round_`; reports RankJoined or RankFailed (and returns False)."""
    layout = spec.layout
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
        store = dist.TCPStore(spec.store_host, spec.store_port, layout.world_size,
                              is_master=False, timeout=_STORE_TIMEOUT)
        dist.init_process_group(spec.dist_backend, store=dist.PrefixStore(f"round{round_}", store),
                                rank=layout.rank, world_size=layout.world_size,
                                timeout=timedelta(seconds=spec.collective_timeout_s))
        collectives.connect(TorchCollectives.create(layout))
        executor.reset()
        executor.warm_up()
    except Exception as error:
        conn.send(RankFailed(spec.rank, f"joining world round {round_} failed: "
                                        f"{type(error).__name__}: {error}"))
        return False
    conn.send(RankJoined(spec.rank, round_))
    return True


def _execute_commands(spec: RankSpec, conn: Connection, executor: PartitionExecutor,
                      collectives: DeferredCollectives) -> None:
    while True:
        try:
            command: RankCommand = conn.recv()
        except EOFError:  # the host is gone
            return
        if isinstance(command, Shutdown):
            return
        if isinstance(command, ResetSequences):
            executor.reset()
        elif isinstance(command, JoinWorld):
            _join(spec, command.round, executor, collectives, conn)
        elif isinstance(command, StepPlan):
            result = _execute_step(executor, command, lambda: _await_masks(conn, command.step_id))
            if spec.layout.leads_partition:
                conn.send(result)
        # else: the masks of a step that failed before it read them


def _await_masks(conn: Connection, step_id: int) -> StepMasks:
    """The masks of step `step_id` (the host sends them right after the plan); older masks of
    a step that failed before reading them are skipped. A host that went away ends the rank."""
    while True:
        try:
            message = conn.recv()
        except EOFError:
            _exit_now(0)
        if isinstance(message, Shutdown):
            _exit_now(0)
        if isinstance(message, StepMasks) and message.step_id == step_id:
            return message
        if not isinstance(message, StepMasks):
            raise RuntimeError(f"rank got {type(message).__name__} while awaiting the masks of "
                               f"step {step_id}")


def _execute_step(executor: PartitionExecutor, plan: StepPlan,
                  await_masks: AwaitMasks) -> StepResult:
    try:
        return executor.execute(plan, await_masks)
    except Exception as error:  # the whole step fails; the scheduler fails its requests
        return StepResult(plan.step_id, error=f"step {plan.step_id} failed: "
                                              f"{type(error).__name__}: {error}")
