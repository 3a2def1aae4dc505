"""This host's rank processes: spawn, torch.distributed, command broadcast, clean stop.

Each local rank is a process (torch.multiprocessing "spawn" context) that joins one process group
(gloo on CPU, nccl on CUDA) through a TCP store the host process serves on a free port, builds its
runtime and a `PartitionExecutor`, warms up, and then executes commands. Commands are typed
dataclasses (`StepPlan`, `ResetSequences`, `Shutdown`) sent to every rank through its own pipe, so
all ranks see the same descriptors in the same order; rank 0 alone answers steps.

A rank ignores SIGINT (the host decides when to stop) and exits when its pipe closes, so a host that
dies never leaves ranks behind.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NoReturn, Optional, Protocol, Union

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from services.common.config import WorkerConfig
from services.worker.capacity import ModelFacts, describe_model
from services.worker.executor import (PartitionExecutor, PartitionLimits, StepPlan, StepResult,
                                      StepRuntime)

_STORE_TIMEOUT = timedelta(seconds=120)
_REAP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank process needs to come up."""

    rank: int
    world_size: int
    dist_backend: str  # "gloo" or "nccl"
    device: str  # "cpu" or "cuda:N"
    store_port: int
    model_dir: Path
    dtype: str  # "float32" or "bfloat16"
    limits: PartitionLimits
    torch_threads: int = 1  # intra-op threads on CPU


@dataclass(frozen=True)
class ResetSequences:
    """Drop every sequence: a new Step stream starts empty."""


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class RankReady:
    rank: int


@dataclass(frozen=True)
class RankFailed:
    rank: int
    error: str


RankCommand = Union[StepPlan, ResetSequences, Shutdown]


class RuntimeFactory(Protocol):
    """Where the model comes from. Must be picklable: `build` runs in the spawned rank processes."""

    def describe(self, config: WorkerConfig) -> ModelFacts:
        """Host side, before any rank starts: model facts and cache capacity, no weights loaded."""
        ...

    def build(self, spec: RankSpec) -> StepRuntime: ...


@dataclass(frozen=True)
class ModelRuntimeFactory:
    """The real DeepSeek-V4 runtime."""

    def describe(self, config: WorkerConfig) -> ModelFacts:
        return describe_model(config)

    def build(self, spec: RankSpec) -> StepRuntime:
        from services.worker.model.runtime import ModelRuntime, RuntimeConfig

        return ModelRuntime(RuntimeConfig(
            model_dir=spec.model_dir, dtype=getattr(torch, spec.dtype), device=spec.device,
            block_size=spec.limits.block_size, num_blocks=spec.limits.num_blocks,
            num_window_blocks=spec.limits.num_window_blocks))


class RankGroupError(Exception):
    """A rank failed to start or exited; the message says which and why."""


def rank_main(spec: RankSpec, factory: RuntimeFactory, conn: Connection) -> None:
    """Entry point of a rank process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        executor = _bring_up(spec, factory)
    except Exception as error:  # reported to the host, which decides what to do
        conn.send(RankFailed(spec.rank, f"{type(error).__name__}: {error}"))
        _exit_now(1)
    conn.send(RankReady(spec.rank))
    _execute_commands(conn, executor, answers_steps=spec.rank == 0)
    dist.destroy_process_group()
    _exit_now(0)


def _exit_now(code: int) -> None:
    """Skips interpreter teardown, which takes seconds once torch is loaded; the rank holds nothing
    that needs it (its results went through the pipe)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _bring_up(spec: RankSpec, factory: RuntimeFactory) -> PartitionExecutor:
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device))
    else:
        torch.set_num_threads(spec.torch_threads)
    store = dist.TCPStore("127.0.0.1", spec.store_port, spec.world_size, is_master=False,
                          timeout=_STORE_TIMEOUT)
    dist.init_process_group(spec.dist_backend, store=store, rank=spec.rank,
                            world_size=spec.world_size)
    executor = PartitionExecutor(factory.build(spec), spec.limits)
    executor.warm_up()
    return executor


def _execute_commands(conn: Connection, executor: PartitionExecutor, answers_steps: bool) -> None:
    while True:
        try:
            command: RankCommand = conn.recv()
        except EOFError:  # the host is gone
            return
        if isinstance(command, Shutdown):
            return
        if isinstance(command, ResetSequences):
            executor.reset()
            continue
        result = _execute_step(executor, command)
        if answers_steps:
            conn.send(result)


def _execute_step(executor: PartitionExecutor, plan: StepPlan) -> StepResult:
    try:
        return executor.execute(plan)
    except Exception as error:  # the whole step fails; the scheduler fails its requests
        return StepResult(plan.step_id, error=f"step {plan.step_id} failed: "
                                              f"{type(error).__name__}: {error}")


@dataclass
class _RankProcess:
    rank: int
    process: Any  # torch.multiprocessing SpawnProcess
    conn: Connection


class RankGroup:
    """Owns this host's rank processes, the pipes to them and the TCP store of their process group.

    Blocking pipe waits run on one dedicated thread, so commands keep their order and the event loop
    never blocks. Once a rank has exited (or `stop` began), every later call raises
    `RankGroupError`.
    """

    def __init__(self, specs_without_port: list[RankSpec], factory: RuntimeFactory) -> None:
        self._specs = specs_without_port
        self._factory = factory
        self._ranks: list[_RankProcess] = []
        self._store: Optional[dist.TCPStore] = None
        # Why the group can no longer run steps (a rank exited, stop() began); None while healthy.
        self._failure: Optional[str] = None
        # Spawning and stopping exclude each other, so a stop during start leaves no rank behind.
        self._spawn_lock = threading.Lock()
        self._commands = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rank-commands")

    @property
    def pids(self) -> list[int]:
        return [rank.process.pid for rank in self._ranks]

    async def start(self) -> None:
        """Spawns the ranks and returns once all loaded their model and warmed up."""
        await self._in_command_thread(self._start_blocking)

    async def step(self, plan: StepPlan) -> StepResult:
        return await self._in_command_thread(self._step_blocking, plan)

    async def reset(self) -> None:
        await self._in_command_thread(self._broadcast, ResetSequences())

    async def wait_for_exit(self) -> str:
        """Returns (with a description) once any rank process has exited."""
        return await asyncio.to_thread(self._wait_for_exit_blocking)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Asks every rank to shut down, then terminates / kills what is left. Idempotent."""
        # Not on the command thread: that one may be blocked in a step of a hung rank.
        await asyncio.to_thread(self._stop_blocking, timeout_s)
        self._commands.shutdown(wait=False, cancel_futures=True)

    async def _in_command_thread(self, function: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._commands, function, *args)

    def _start_blocking(self) -> None:
        world_size = len(self._specs)
        self._store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                    wait_for_workers=False, timeout=_STORE_TIMEOUT)
        context = torch_mp.get_context("spawn")
        for template in self._specs:
            spec = dataclasses.replace(template, store_port=self._store.port)
            with self._spawn_lock:
                self._raise_if_failed()
                parent_conn, child_conn = context.Pipe()
                process = context.Process(target=rank_main, args=(spec, self._factory, child_conn),
                                          name=f"dsv4serve-rank{spec.rank}", daemon=True)
                process.start()
                child_conn.close()
                self._ranks.append(_RankProcess(spec.rank, process, parent_conn))
        for rank in self._ranks:
            self._await_ready(rank)

    def _await_ready(self, rank: _RankProcess) -> None:
        message = self._receive(rank)
        if isinstance(message, RankFailed):
            self._failure = f"rank {message.rank} failed to start: {message.error}"
            raise RankGroupError(self._failure)
        if not isinstance(message, RankReady):
            raise RankGroupError(f"rank {rank.rank} sent {type(message).__name__} instead of ready")

    def _step_blocking(self, plan: StepPlan) -> StepResult:
        self._broadcast(plan)
        result = self._receive(self._ranks[0])
        if not isinstance(result, StepResult):
            raise RankGroupError(f"rank 0 answered step {plan.step_id} "
                                 f"with {type(result).__name__}")
        return result

    def _broadcast(self, command: RankCommand) -> None:
        self._raise_if_failed()
        for rank in self._ranks:
            try:
                rank.conn.send(command)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self._fail(self._describe_exit())

    def _receive(self, rank: _RankProcess) -> Any:
        """Waits for the rank's next message, or for any rank to exit (then raises)."""
        self._raise_if_failed()
        watched = [rank.conn] + [other.process.sentinel for other in self._ranks]
        ready = wait(watched)
        if rank.conn in ready:
            try:
                return rank.conn.recv()
            except (EOFError, OSError):
                pass
        self._fail(self._describe_exit())

    def _wait_for_exit_blocking(self) -> str:
        wait([rank.process.sentinel for rank in self._ranks])
        return self._describe_exit()

    def _describe_exit(self) -> str:
        for rank in self._ranks:
            if wait([rank.process.sentinel], timeout=0):
                # The sentinel fires as the process closes its fds, just before it can be reaped.
                rank.process.join(_REAP_TIMEOUT_S)
                return (f"rank {rank.rank} (pid {rank.process.pid}) exited with code "
                        f"{rank.process.exitcode}")
        return "a rank closed its pipe"

    def _fail(self, reason: str) -> NoReturn:
        self._failure = self._failure or reason
        raise RankGroupError(self._failure)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RankGroupError(self._failure)

    def _stop_blocking(self, timeout_s: float) -> None:
        with self._spawn_lock:
            self._failure = self._failure or "the worker is stopping"
            ranks = list(self._ranks)
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
        self._store = None


def rank_specs(config: WorkerConfig, facts: ModelFacts) -> list[RankSpec]:
    """One spec per local rank (store port filled in at start). All ranks of a host share
    partition 0 until data parallelism across partitions lands."""
    topology = config.topology
    on_cuda = topology.backend == "cuda"
    limits = PartitionLimits(partition_id=0, vocab_size=facts.vocab_size,
                             block_size=config.block_size,
                             num_blocks=facts.num_blocks("compressed"),
                             num_window_blocks=facts.num_blocks("window"))
    specs = []
    for rank in range(topology.world_size):
        device_index = topology.devices[rank] if topology.devices else rank
        device = f"cuda:{device_index}" if on_cuda else "cpu"
        specs.append(RankSpec(rank=rank, world_size=topology.world_size,
                              dist_backend="nccl" if on_cuda else "gloo", device=device,
                              store_port=0, model_dir=config.model_dir,
                              dtype=facts.compute_dtype, limits=limits,
                              torch_threads=config.torch_threads))
    return specs
