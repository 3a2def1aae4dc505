"""This host's rank processes: spawn, world rounds, command broadcast, clean stop.

Each local rank is a process (torch.multiprocessing "spawn" context; see rank_process.py) with its
own pipe. Every rank receives every command in the same order; for a step, the partition leaders
among this host's ranks (TP rank 0 of each DP group) answer and their answers are merged.

A step goes to the ranks the moment it is handed over, behind any step still running: under async
scheduling step N+1 arrives while N runs, and the ranks start it as soon as N is done (they feed its
rows the tokens N sampled themselves; executor.py). One thread sends every message to the ranks in
order — plans, masks, other commands — and another reads the steps' answers in the same order, so
sending N+1 never waits for N's answer.

The world's TCPStore lives in the host process that drives global rank 0 (on a free local port when
this host drives the whole world, else at `--dist-init-addr`), so it outlives rank restarts. A host
that drives the whole world forms round 1 as soon as its ranks have loaded. A host that drives part
of a larger world loads its ranks and waits for `join(round)` (the scheduler's JoinWorld); a later
round re-forms the world after another worker restarted — in place when this host's ranks are
alive, by respawning them when one has exited.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, NoReturn, Optional

import torch.distributed as dist
import torch.multiprocessing as torch_mp

from services.common.step_descriptors import StepPlan, StepResult, merge_results
from services.worker.rank_messages import (JoinWorld, RankCommand, RankFailed, RankJoined,
                                           RankLoaded, RankSpec, ResetSequences)
from services.worker.rank_plan import RuntimeFactory, StoreAddress
from services.worker.rank_processes import (REAP_TIMEOUT_S, RankProcess, describe_exit, kill_all,
                                             stop_all)
from services.worker.rank_process import rank_main

_STORE_TIMEOUT = timedelta(seconds=120)


class RankGroupError(Exception):
    """A rank failed to start or exited; the message says which and why."""


class RankGroup:
    """Owns this host's rank processes, the pipes to them and (on rank 0's host) the world's store.

    Blocking pipe work runs on two dedicated threads — one sends every command in order, one reads
    the steps' answers in order — so the event loop never blocks. Once a rank has exited (or `stop`
    began), every later step raises `RankGroupError` — until a `join` respawns the ranks (worlds of
    several hosts only). A reset goes to the ranks in order behind the steps before it; a join
    reads the ranks' replies on the send thread, so it needs no step in flight (JoinWorld awaits
    `settled()` first).
    """

    def __init__(self, specs: list[RankSpec], factory: RuntimeFactory, store: StoreAddress,
                 forms_world_alone: bool) -> None:
        self._specs = specs
        self._factory = factory
        self._store_address = store
        self.forms_world_alone = forms_world_alone
        self._ranks: list[RankProcess] = []
        self._store: Optional[dist.TCPStore] = None
        # Why the group can no longer run steps (a rank exited, stop() began); None while healthy.
        self._failure: Optional[str] = None
        self._stopping = False
        self.world_round = 0  # 0: not joined
        # Spawning and stopping exclude each other, so a stop during start leaves no rank behind.
        self._spawn_lock = threading.Lock()
        self._commands = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rank-commands")
        self._answers = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rank-answers")
        self._steps_in_flight: set[asyncio.Future] = set()  # handed over, answers not read yet
        self._running_commands = 0
        self._count_lock = threading.Lock()

    @property
    def pids(self) -> list[int]:
        return [rank.process.pid for rank in self._ranks]

    async def start(self) -> None:
        """Spawns the ranks and returns once all loaded their model (and, forming the world alone,
        joined round 1 and warmed up)."""
        await self._in_command_thread(self._start_blocking)

    async def join(self, round_: int) -> None:
        """(Re)joins the world as round `round_`; raises RankGroupError when a rank cannot."""
        await self._in_command_thread(self._join_blocking, round_)

    async def step(self, plan: StepPlan,
                   masks: Optional[concurrent.futures.Future] = None) -> StepResult:
        """Runs the step on every rank (see `hand_over`) and returns the merged answers."""
        return await self.hand_over(plan, masks)

    def hand_over(self, plan: StepPlan,
                  masks: Optional[concurrent.futures.Future] = None) -> asyncio.Future:
        """Sends the step to every rank behind the steps handed over before it; the future
        resolves to the merged answers (or raises `RankGroupError`). `masks` (when the plan's
        masks follow) resolves to its StepMasks: the ranks get them once they are there, and
        wait for them only to sample. Cancelling the future does not withdraw the step: it runs,
        and its answers are read (and dropped), so a later step's answers are its own."""
        if self._stopping:
            raise RankGroupError("the worker is stopping")
        sent = self._commands.submit(self._send_step, plan, masks)
        answered = asyncio.wrap_future(self._answers.submit(self._collect_step, plan, sent))
        self._steps_in_flight.add(answered)
        answered.add_done_callback(self._step_settled)
        return asyncio.shield(answered)  # a cancelled caller's step is still read in its turn

    async def settled(self) -> None:
        """Returns once every step handed over so far has been answered or has failed."""
        await asyncio.gather(*self._steps_in_flight, return_exceptions=True)

    async def reset(self) -> None:
        await self._in_command_thread(self._broadcast, ResetSequences())

    async def wait_for_exit(self) -> str:
        """Returns (with a description) once any of the current rank processes has exited (after a
        respawning `join`, call again to watch the new ones)."""
        ranks = list(self._ranks)
        return await asyncio.to_thread(self._wait_for_exit_blocking, ranks)

    async def kill(self) -> None:
        """SIGKILL every rank now (a command blocked on them fails); the next `join` respawns
        them. For ranks stuck in a world that is being replaced."""
        await asyncio.to_thread(self._kill_blocking)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Asks every rank to shut down, then terminates / kills what is left. Idempotent."""
        self._stopping = True
        # Not on the command thread: that one may be blocked in a step of a hung rank.
        await asyncio.to_thread(self._stop_blocking, timeout_s)
        self._commands.shutdown(wait=False, cancel_futures=True)
        self._answers.shutdown(wait=False)  # each step still handed over fails or is answered
        self._store = None

    @property
    def busy(self) -> bool:
        """A command or step is running on the ranks (it may outlive the caller that gave up on
        it)."""
        return self._running_commands > 0 or bool(self._steps_in_flight)

    def _step_settled(self, answered: asyncio.Future) -> None:
        self._steps_in_flight.discard(answered)
        answered.exception()  # read here: a caller that gave up never will

    async def _in_command_thread(self, function: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._commands, self._counted, function, *args)

    def _counted(self, function: Any, *args: Any) -> Any:
        with self._count_lock:
            self._running_commands += 1
        try:
            return function(*args)
        finally:
            with self._count_lock:
                self._running_commands -= 1

    # ---- command thread -------------------------------------------------------------------------
    def _start_blocking(self) -> None:
        address = self._store_address
        if address.serve:
            self._store = dist.TCPStore(address.host, address.port, None, is_master=True,
                                        wait_for_workers=False, timeout=_STORE_TIMEOUT)
        port = self._store.port if self._store is not None else address.port
        self._specs = [dataclasses.replace(spec, store_port=port) for spec in self._specs]
        join_round = 1 if self.forms_world_alone else None
        self._spawn_all(join_round)

    def _spawn_all(self, join_round: Optional[int]) -> None:
        context = torch_mp.get_context("spawn")
        for template in self._specs:
            spec = dataclasses.replace(template, join_round=join_round)
            with self._spawn_lock:
                if self._stopping:
                    raise RankGroupError("the worker is stopping")
                parent_conn, child_conn = context.Pipe()
                process = context.Process(target=rank_main, args=(spec, self._factory, child_conn),
                                          name=f"dsv4serve-rank{spec.rank}", daemon=True)
                process.start()
                child_conn.close()
                self._ranks.append(RankProcess(spec, process, parent_conn))
        for rank in self._ranks:
            self._expect(rank, RankLoaded, "failed to start")
        if join_round is not None:
            self._await_joined(join_round)

    def _join_blocking(self, round_: int) -> None:
        if self._failure is not None and not self._stopping:
            self._respawn(round_)
            return
        self._broadcast(JoinWorld(round_))
        self._await_joined(round_)

    def _respawn(self, round_: int) -> None:
        """Replace every local rank (one has exited) with fresh ones that join `round_`."""
        self._stop_blocking(REAP_TIMEOUT_S)
        self._ranks, self._failure, self.world_round = [], None, 0
        self._spawn_all(round_)

    def _await_joined(self, round_: int) -> None:
        for rank in self._ranks:
            self._expect(rank, RankJoined, f"failed to join world round {round_}")
        self.world_round = round_

    def _expect(self, rank: RankProcess, kind: type, failing: str) -> None:
        message = self._receive(rank)
        if isinstance(message, RankFailed):
            raise RankGroupError(f"rank {message.rank} {failing}: {message.error}")
        if not isinstance(message, kind):
            raise RankGroupError(f"rank {rank.spec.rank} sent {type(message).__name__} instead "
                                 f"of {kind.__name__}")

    # ---- step threads ---------------------------------------------------------------------------
    def _send_step(self, plan: StepPlan, masks: Optional[concurrent.futures.Future]) -> None:
        """On the command thread: the plan to every rank, then its masks once they are there."""
        self._raise_if_failed()
        if self.world_round == 0:
            raise RankGroupError("this worker's ranks have not joined a world yet")
        self._broadcast(plan)
        if masks is not None:
            self._broadcast(masks.result())

    def _collect_step(self, plan: StepPlan, sent: concurrent.futures.Future) -> StepResult:
        """On the answer thread: the partition leaders' answers to the step, once it was sent."""
        try:
            sent.result()  # raises what sending raised: then no rank answers
        except concurrent.futures.CancelledError:  # `stop` withdrew it before it was sent
            raise RankGroupError("the worker is stopping") from None
        leaders = [rank for rank in self._ranks if rank.spec.layout.leads_partition]
        answers = [self._receive(rank) for rank in leaders]
        for answer in answers:
            if not isinstance(answer, StepResult):  # the pipe is out of step: nothing after counts
                self._fail(f"a rank answered step {plan.step_id} with {type(answer).__name__}")
        return merge_results(answers) if answers else StepResult(plan.step_id)

    def _broadcast(self, command: RankCommand) -> None:
        self._raise_if_failed()
        message = ForkingPickler.dumps(command)  # once for all ranks
        for rank in self._ranks:
            try:
                rank.conn.send_bytes(message)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self._fail(describe_exit(self._ranks))

    def _receive(self, rank: RankProcess) -> Any:
        """Waits for the rank's next message, or for any rank to exit (then raises)."""
        self._raise_if_failed()
        watched = [rank.conn] + [other.process.sentinel for other in self._ranks]
        ready = wait(watched)
        if rank.conn in ready:
            try:
                return rank.conn.recv()
            except (EOFError, OSError):
                pass
        self._fail(describe_exit(self._ranks))

    def _fail(self, reason: str) -> NoReturn:
        self._failure = self._failure or reason
        self.world_round = 0
        raise RankGroupError(self._failure)

    def _raise_if_failed(self) -> None:
        if self._stopping:
            raise RankGroupError("the worker is stopping")
        if self._failure is not None:
            raise RankGroupError(self._failure)

    # ---- any thread -----------------------------------------------------------------------------
    def _wait_for_exit_blocking(self, ranks: list[RankProcess]) -> str:
        wait([rank.process.sentinel for rank in ranks])
        return describe_exit(ranks)

    def _kill_blocking(self) -> None:
        with self._spawn_lock:
            ranks = list(self._ranks)
        kill_all(ranks)

    def _stop_blocking(self, timeout_s: float) -> None:
        with self._spawn_lock:
            ranks = list(self._ranks)
        stop_all(ranks, timeout_s)
