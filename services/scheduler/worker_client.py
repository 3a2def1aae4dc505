"""The deployment's workers as one unit: handshake, world formation, Step fan-out, supervision.

`WorkerSet` is ready when every worker has passed the handshake, the workers agree on one world
(same topology, their ranks covering it exactly once), that world is formed, and every worker has a
Step stream; then the step loop is told `on_ready(description)`. A deployment of several workers
forms its torch.distributed world through JoinWorld: on first contact, whenever the workers' rounds
disagree (one restarted), and after any loss. A step that fails or times out, or a periodic probe
(`Describe`) that fails, closes every stream, marks the set not ready and tells `on_lost(reason)`;
the supervisor keeps re-handshaking until every worker is back, re-forms the world if needed, then
opens new streams (which start with no sequences) and reports ready again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Optional

from services.common.build_info import ABI_VERSION, build_id
from services.common.config import TlsConfig
from services.common.step_descriptors import StepMasks, StepPlan, StepResult, merge_results
from services.common.step_protos import masks_to_proto, plan_to_proto
from services.scheduler.errors import WorkerLost
from services.scheduler.worker_connection import (HandshakeRefused, WorkerConnection,
                                                  WorkerStatusView, WorkerTimeouts,
                                                  WorkerUnreachable)
from services.scheduler.worker_description import WorkerDescription
from services.scheduler.world_checks import disagreement, needs_join

log = logging.getLogger(__name__)

PROBE_TIMEOUTS_TO_LOSE = 3


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    workers: list[WorkerStatusView]


class WorkerSet:
    """Every worker of the deployment, handled as one unit: every step goes to all (each gets the
    rows of the partitions it holds; workers holding the same partition get the same rows),
    readiness needs all."""

    def __init__(self, addresses: tuple[str, ...], *, block_size: int,
                 expected_fingerprint: Optional[str], probe_interval_s: float,
                 timeouts: WorkerTimeouts, on_ready: Callable[[WorkerDescription], None],
                 on_lost: Callable[[str], None], tls: TlsConfig = TlsConfig()) -> None:
        self._connections = [WorkerConnection(address, tls) for address in addresses]
        self._block_size = block_size
        self._reference_fingerprint = expected_fingerprint
        self._fingerprint_source = "the expected fingerprint" if expected_fingerprint else ""
        self._probe_interval_s = probe_interval_s
        self._timeouts = timeouts
        self._on_ready = on_ready
        self._on_lost = on_lost
        self._wake = asyncio.Event()
        self._supervisor: Optional[asyncio.Task] = None
        self.ready = False
        self._lost_reason = ""
        self.description: Optional[WorkerDescription] = None
        # The world round this scheduler formed last; a new scheduler, and every loss, re-forms
        # a world of several workers (its old collectives may be stuck on a lost peer).
        self._world_round = 0
        self._world_current = False
        # The last round a formation was tried with, formed or not: a failed attempt leaves its
        # ranks' addresses under the round's prefix in the world's TCPStore, so a retry under the
        # same number would rendezvous with ranks that are gone. Every attempt takes a new number.
        self._round_tried = 0
        # Counts the times the set became ready: descriptions fetched before the latest time
        # describe another world and are not held against it.
        self._readiness_epoch = 0

    def start(self) -> None:
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(),
                                                                  name="worker supervisor")

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        for connection in self._connections:
            await connection.close()

    # ---- supervision ------------------------------------------------------------------------
    async def _supervise(self) -> None:
        while True:
            if self.ready:
                await self._probe()
            else:
                await self._connect_all()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._probe_interval_s)
            except asyncio.TimeoutError:
                pass

    async def _connect_all(self) -> None:
        handshakes = await asyncio.gather(*(self._handshake(c) for c in self._connections))
        if not all(handshakes) or not self._one_world() or not await self._formed_world():
            return
        first = self._connections[0].description
        partitions = sorted({p for c in self._connections for p in c.description.partition_ids})
        budget = min(c.description.max_num_batched_tokens for c in self._connections)
        seq_bounds = [c.description.max_num_seqs for c in self._connections
                      if c.description.max_num_seqs]
        self.description = replace(first, partition_ids=tuple(partitions),
                                   max_num_batched_tokens=budget,
                                   max_num_seqs=min(seq_bounds, default=0))
        for connection in self._connections:
            connection.open_stream()
        self.ready = True
        self._readiness_epoch += 1
        log.info("all %d workers connected; partitions %s", len(self._connections), partitions)
        self._on_ready(self.description)

    def _one_world(self) -> bool:
        """The workers agree on the topology and block capacity (every partition gets the first
        worker's), and their ranks cover the world exactly once; else one is refused."""
        problem = disagreement([(c.address, c.description) for c in self._connections])
        if problem is None:
            return True
        address, why = problem
        connection = next(c for c in self._connections if c.address == address)
        if connection.error != why:
            log.error("%s", why)
        connection.error, connection.description = why, None
        return False

    async def _formed_world(self) -> bool:
        """Forms a new world round through JoinWorld when the workers need one."""
        described = [c.description for c in self._connections]
        rounds = {d.world_round for d in described}
        if not needs_join(described) or (self._world_current and len(rounds) == 1
                                         and 0 not in rounds):
            return True
        round_ = max(rounds | {self._world_round, self._round_tried}) + 1
        self._round_tried = round_
        log.info("forming world round %d over %d workers", round_, len(self._connections))
        outcomes = await asyncio.gather(
            *(c.join_world(round_, self._timeouts.join_s) for c in self._connections),
            return_exceptions=True)
        failed = [(c, o) for c, o in zip(self._connections, outcomes) if isinstance(o, Exception)]
        for connection, error in failed:
            connection.error = str(error)
        if failed:
            return False
        self._world_round, self._world_current = round_, True
        return True

    async def _handshake(self, connection: WorkerConnection) -> bool:
        try:
            description = await connection.describe(self._timeouts.probe_s)
            self._validate(connection.address, description)
        except WorkerUnreachable as error:
            connection.description = None
            connection.error = str(error)
            return False
        except HandshakeRefused as refused:
            if connection.error != str(refused):
                log.error("%s", refused)
            connection.description = None
            connection.error = str(refused)
            return False
        connection.description = description
        connection.error = ""
        return True

    def _validate(self, address: str, description: WorkerDescription) -> None:
        if description.abi_version != ABI_VERSION:
            raise HandshakeRefused(
                f"worker {address} refused: its ABI version is {description.abi_version} (build "
                f"{description.build_id}) but this scheduler's ABI version is {ABI_VERSION} (build "
                f"{build_id()}); scheduler and workers must come from the same release")
        if self._reference_fingerprint is None:
            self._reference_fingerprint = description.model_fingerprint
            self._fingerprint_source = f"the first worker's ({address})"
        elif description.model_fingerprint != self._reference_fingerprint:
            raise HandshakeRefused(
                f"worker {address} refused: its model fingerprint {description.model_fingerprint} "
                f"differs from {self._fingerprint_source} {self._reference_fingerprint}")
        if description.block_size != self._block_size:
            raise HandshakeRefused(
                f"worker {address} refused: its block size is {description.block_size} but the "
                f"scheduler's --block-size is {self._block_size}")

    async def _probe(self) -> None:
        """A worker that refuses or is gone is lost at once; one that is only slow to answer is
        lost after PROBE_TIMEOUTS_TO_LOSE probes in a row (a loaded host is not a dead one)."""
        outcomes = await self._describe_all()
        if self._lose_changed(outcomes):
            return
        for connection, outcome in zip(self._connections, outcomes):
            if not isinstance(outcome, WorkerUnreachable):
                connection.probe_timeouts = 0
                continue
            connection.probe_timeouts = connection.probe_timeouts + 1 if outcome.timed_out else 0
            if not outcome.timed_out or connection.probe_timeouts >= PROBE_TIMEOUTS_TO_LOSE:
                self._lose(connection, f"probe failed: {outcome}")
                return

    def _lose_changed(self, outcomes: list) -> bool:
        """Loses the first worker whose fresh description shows it is not the process (or world
        round) of the handshake: it restarted between two probes, or its ranks left the world.
        Its Step stream is gone even though it answers again."""
        for connection, outcome in zip(self._connections, outcomes):
            change = None if isinstance(outcome, WorkerUnreachable) else self._change(connection,
                                                                                     outcome)
            if change:
                self._lose(connection, change)
                return True
        return False

    def _change(self, connection: WorkerConnection, now: WorkerDescription) -> Optional[str]:
        then = connection.description
        if not self.ready or then is None:
            return None
        if now.instance_id != then.instance_id:
            return f"worker {connection.address} restarted since the handshake (a new process)"
        if needs_join([then]) and now.world_round != self._world_round:
            return (f"worker {connection.address} left world round {self._world_round} (it "
                    f"reports round {now.world_round})")
        return None

    async def _describe_all(self) -> list:
        """Each worker's description or its WorkerUnreachable."""
        probes = (c.describe(self._timeouts.probe_s) for c in self._connections)
        return await asyncio.gather(*probes, return_exceptions=True)

    def _lose(self, connection: WorkerConnection, reason: str) -> None:
        connection.error = reason
        if not self.ready:
            return
        log.error("%s; failing in-flight requests and reconnecting", reason)
        self.ready = False
        self._world_current = False
        self._lost_reason = reason
        for each in self._connections:
            each.close_stream()
        self._on_lost(reason)
        self._wake.set()

    # ---- steps and readiness ----------------------------------------------------------------
    async def send(self, plan: StepPlan) -> None:
        """Send the plan to every worker (each gets the rows of the partitions it holds) without
        waiting for the answers; raises WorkerLost."""
        if len(self._connections) == 1:
            requests = [plan_to_proto(plan)]
        else:
            requests = [plan_to_proto(plan.restricted_to(frozenset(c.description.partition_ids)))
                        for c in self._connections]
        await self._on_every_worker(lambda c, i: c.send(requests[i], self._timeouts.step_s))

    async def send_masks(self, plan: StepPlan, masks: StepMasks) -> None:
        """Send the masks of `plan`'s `mask_follows` rows (each worker those of its rows)."""
        if len(self._connections) == 1:
            messages = [masks_to_proto(masks)]
        else:
            messages = [masks_to_proto(masks.restricted_to(
                {r.seq_id for r in plan.rows if r.partition_id in c.description.partition_ids}))
                for c in self._connections]
        await self._on_every_worker(lambda c, i: c.send(messages[i], self._timeouts.step_s))

    async def receive(self, plan: StepPlan) -> StepResult:
        """Every worker's answer to `plan` (the oldest step unanswered), merged."""
        return merge_results(await self._on_every_worker(
            lambda c, i: c.receive(plan.step_id, self._timeouts.step_s)))

    async def _on_every_worker(self, call: Callable[[WorkerConnection, int], Awaitable[Any]]
                               ) -> list[Any]:
        """`call(connection, index)` on every worker at once; a worker that fails is lost (then
        raises WorkerLost)."""
        if not self.ready:
            raise WorkerLost(self._lost_reason or "workers are not connected")
        outcomes = await asyncio.gather(
            *(call(c, i) for i, c in enumerate(self._connections)), return_exceptions=True)
        for connection, outcome in zip(self._connections, outcomes):
            if isinstance(outcome, WorkerLost):
                if not self.ready:  # lost meanwhile (a probe): that is the reason to report
                    raise WorkerLost(self._lost_reason)
                self._lose(connection, str(outcome))
                raise outcome
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes

    async def check_ready(self) -> Readiness:
        """A fresh Describe round trip to every worker (short timeout); a worker found restarted
        is lost here as at a probe, so readiness never reports a world that is gone."""
        epoch = self._readiness_epoch
        outcomes = await self._describe_all()
        if epoch == self._readiness_epoch:
            self._lose_changed(outcomes)
        failures = [str(o) for o in outcomes if isinstance(o, WorkerUnreachable)]
        if failures:
            reason = "; ".join(failures)
        elif not self.ready:
            reason = "; ".join(f"worker {c.address}: {c.error}" for c in self._connections
                               if c.error) or "workers are reconnecting"
        else:
            reason = ""
        return Readiness(not reason, reason, self.statuses())

    def statuses(self) -> list[WorkerStatusView]:
        now = time.monotonic()
        return [c.status(now) for c in self._connections]
