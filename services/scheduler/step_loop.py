"""The step loop: the one asyncio task that owns every live request, the queues, the block tables.

Everything else talks to it through commands (plain callables run inside the loop task between
steps), so no state is shared and no locks are needed. The loop never runs a step with nothing to
do: when the scheduler has no plan it waits for the next command (or the next stall deadline).
Grammar compilation runs in its own task; its result comes back as a command, so the loop never
waits on a compile.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Awaitable, Callable, Optional

from services.common.config import SchedulerConfig
from services.scheduler.admission import AdmissionLimits, admit, check_queue_room
from services.scheduler.errors import ErrorKind, SchedulerError, WorkerLost
from services.scheduler.grammar_backend import GrammarBackend, GrammarFactory, compile_constraint
from services.scheduler.requests import (AdmittedEvent, EventSink, FailedEvent, FinishedEvent,
                                         FinishReason, GenerateParams, Request, RequestPhase)
from services.scheduler.limits import SchedulerCounters
from services.scheduler.scheduler import Scheduler
from services.scheduler.state_view import RequestSnapshot, SchedulerSnapshot, snapshot_request
from services.scheduler.step_pipeline import StepExecutor, StepPipeline, pipeline_depth
from services.scheduler.world_scheduler import scheduler_for_world
from services.scheduler.worker_description import WorkerDescription

log = logging.getLogger(__name__)

Command = Callable[[], None]


class StepLoop:
    def __init__(self, config: SchedulerConfig, executor: StepExecutor,
                 grammar_factory: GrammarFactory) -> None:
        self._config = config
        self._counters = SchedulerCounters()
        self._pipeline = StepPipeline(executor, pipeline_depth(config), self._counters)
        self._grammar_factory = grammar_factory
        self._commands: asyncio.Queue[Command] = asyncio.Queue()
        self._requests: dict[str, Request] = {}
        self._sinks: dict[str, EventSink] = {}  # request id → the sink its Generate call passed
        self._compiles: dict[str, asyncio.Task] = {}
        self._arrivals = itertools.count()
        self._stopped = False  # set when `run` ends (cancelled or crashed): commands never run
        self._pending_replies: set[asyncio.Future] = set()
        self._scheduler: Optional[Scheduler] = None
        self._description: Optional[WorkerDescription] = None
        # Built in a thread once the first handshake told vocab and EOS (loading the tokenizer
        # and XGrammar's tables takes seconds); `grammar` is set when it is done.
        self._grammar_build: Optional[asyncio.Task] = None
        self.grammar: Optional[GrammarBackend] = None
        self.not_ready_reason = "no worker has completed its handshake yet"
        self._refusal = ""  # set by `stop_admitting`: why new requests are refused

    # ---- called from other tasks (servicer, worker client); each enqueues a command ----------
    def submit(self, params: GenerateParams, emit: EventSink) -> None:
        if self._stopped:
            emit(FailedEvent(ErrorKind.UNAVAILABLE, "the scheduler's step loop has stopped"))
            return
        self._commands.put_nowait(lambda: self._on_submit(params, emit))

    async def abort(self, request_id: str) -> bool:
        return await self._ask(lambda: self._on_abort(request_id))

    def cancel(self, request_id: str, emit: EventSink) -> None:
        """The Generate call that submitted with `emit` went away: abort its request, if live."""
        def on_cancel() -> None:
            if self._sinks.get(request_id) is emit:
                self._on_abort(request_id)
        self._commands.put_nowait(on_cancel)

    async def snapshot(self, include_requests: bool) -> SchedulerSnapshot:
        return await self._ask(lambda: self._snapshot(include_requests))

    async def request_snapshot(self, request_id: str) -> Optional[RequestSnapshot]:
        return await self._ask(lambda: self._request_snapshot(request_id))

    def stop_admitting(self, reason: str) -> None:
        """Graceful stop: refuse new requests with UNAVAILABLE; live ones go on."""
        self._commands.put_nowait(lambda: setattr(self, "_refusal", reason))

    async def num_live_requests(self) -> int:
        return await self._ask(lambda: len(self._requests))

    async def fail_live_requests(self, message: str) -> int:
        """Fail every live request with UNAVAILABLE (end of a graceful stop); how many there were."""
        def fail_all() -> int:
            live = list(self._requests.values())
            for request in live:
                self._fail_anywhere(request, ErrorKind.UNAVAILABLE, message)
            return len(live)
        return await self._ask(fail_all)

    def workers_ready(self, description: WorkerDescription) -> None:
        self._commands.put_nowait(lambda: self._on_workers_ready(description))

    def workers_lost(self, reason: str) -> None:
        self._commands.put_nowait(lambda: self._on_workers_lost(reason))

    async def _ask(self, query: Callable[[], Any]) -> Any:
        if self._stopped:
            raise SchedulerError(ErrorKind.UNAVAILABLE, "the scheduler's step loop has stopped")
        reply: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending_replies.add(reply)
        reply.add_done_callback(self._pending_replies.discard)
        # The caller may have gone (cancelled RPC): then nobody wants the answer.
        self._commands.put_nowait(lambda: reply.done() or reply.set_result(query()))
        return await reply

    # ---- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while True:
                self._run_pending_commands()
                if await self._send_next_plan():
                    continue
                if self._pipeline.busy:
                    await self._unless_workers_lost(self._pipeline.complete_oldest(self._scheduler))
                    continue
                await self._wait_for_command()
        except Exception:
            log.exception("the step loop crashed; failing every live request")
            raise
        finally:
            self._stopped = True
            self._release_everything()
            for reply in [r for r in self._pending_replies if not r.done()]:
                reply.set_exception(SchedulerError(ErrorKind.UNAVAILABLE,
                                                   "the scheduler's step loop has stopped"))

    def _run_pending_commands(self) -> None:
        while not self._commands.empty():
            self._commands.get_nowait()()

    async def _wait_for_command(self) -> None:
        timeout = self._scheduler.seconds_until_stall_deadline() if self._scheduler else None
        try:
            command = await asyncio.wait_for(self._commands.get(), timeout)
        except asyncio.TimeoutError:
            return
        command()

    async def _send_next_plan(self) -> bool:
        """Plan and send a step when the pipeline has room (one step ahead with async
        scheduling); False when there was no room or nothing to plan."""
        if self._scheduler is None or not self._pipeline.has_room:
            return False
        plan = self._scheduler.schedule()
        if plan is None:
            return False
        await self._unless_workers_lost(self._pipeline.send(plan))
        return True

    async def _unless_workers_lost(self, operation: Awaitable[None]) -> None:
        try:
            await operation
        except WorkerLost as lost:
            self._on_workers_lost(str(lost))

    # ---- commands ---------------------------------------------------------------------------
    def _on_submit(self, params: GenerateParams, emit: EventSink) -> None:
        try:
            request, admitted = self._admit(params, emit)
        except SchedulerError as error:
            emit(FailedEvent(error.kind, error.message, error.retry_after_s))
            return
        self._requests[request.request_id] = request
        self._sinks[request.request_id] = emit
        request.emit = self._forgetting(request, emit)
        if request.constraint is None:
            request.emit(admitted)
            self._scheduler.add(request)
            return
        request.phase = RequestPhase.GRAMMAR_PENDING
        request.grammar_status = "pending"
        task = asyncio.get_running_loop().create_task(
            self._compile(request, admitted), name=f"compile {request.request_id}")
        self._compiles[request.request_id] = task

    def _admit(self, params: GenerateParams, emit: EventSink) -> tuple[Request, AdmittedEvent]:
        if self._scheduler is None:
            raise SchedulerError(ErrorKind.UNAVAILABLE, f"not ready: {self.not_ready_reason}")
        if self._refusal:
            raise SchedulerError(ErrorKind.UNAVAILABLE, self._refusal)
        check_queue_room(self._config.max_waiting_requests,
                         len(self._scheduler.waiting) + len(self._compiles))
        if params.request_id in self._requests:
            raise SchedulerError(ErrorKind.INVALID_ARGUMENT,
                                 f"request id {params.request_id!r} is already live")
        limits = AdmissionLimits(self._config.max_model_len,
                                 self._config.generate_defaults.max_new_tokens,
                                 self._description.vocab_size)
        request, admitted = admit(params, limits, next(self._arrivals), emit)
        if not self._scheduler.kv.fits_empty_partition(len(request.prompt_token_ids) + 1):
            raise SchedulerError(ErrorKind.RESOURCE_EXHAUSTED,
                                 f"the prompt ({len(request.prompt_token_ids)} tokens) can never "
                                 f"fit the KV cache of one partition")
        return request, admitted

    def _forgetting(self, request: Request, emit: EventSink) -> EventSink:
        """Wrap the sink so a terminal event also drops the request from the live table."""
        def forward(event: Any) -> None:
            if request.phase is RequestPhase.FINISHED:
                self._requests.pop(request.request_id, None)
                self._sinks.pop(request.request_id, None)
            emit(event)
        return forward

    async def _compile(self, request: Request, admitted: AdmittedEvent) -> None:
        try:
            grammar = await asyncio.shield(self._grammar_build)
            compiled = await compile_constraint(grammar, request.constraint)
        except SchedulerError as error:
            failure = error  # `error` is unbound when the except block ends
            self._commands.put_nowait(lambda: self._on_compile_failed(request, failure))
        except Exception as error:  # a grammar bug: fail this request, never leave it pending
            log.exception("compiling the constraint of request %s failed", request.request_id)
            failure = SchedulerError(ErrorKind.INTERNAL, f"grammar compile failed: {error}")
            self._commands.put_nowait(lambda: self._on_compile_failed(request, failure))
        else:
            self._commands.put_nowait(
                lambda: self._on_compiled(request, admitted, grammar, compiled))

    def _on_compiled(self, request: Request, admitted: AdmittedEvent, grammar: GrammarBackend,
                     compiled: Any) -> None:
        self._compiles.pop(request.request_id, None)
        if request.phase is not RequestPhase.GRAMMAR_PENDING or self._scheduler is None:
            return
        request.matcher_factory = lambda: grammar.matcher(compiled)
        request.matcher = request.matcher_factory()
        request.grammar_status = "ready"
        request.emit(admitted)
        self._scheduler.add(request)

    def _on_compile_failed(self, request: Request, error: SchedulerError) -> None:
        self._compiles.pop(request.request_id, None)
        if request.phase is RequestPhase.GRAMMAR_PENDING:
            request.phase = RequestPhase.FINISHED
            request.emit(FailedEvent(error.kind, error.message))

    def _on_abort(self, request_id: str) -> bool:
        request = self._requests.get(request_id)
        if request is None:
            return False
        if request.phase is RequestPhase.GRAMMAR_PENDING:
            # Keep the stream contract (admitted first), then finish as aborted.
            self._compiles.pop(request_id).cancel()
            request.phase = RequestPhase.FINISHED
            prompt_tokens = len(request.prompt_token_ids)
            request.emit(AdmittedEvent(prompt_tokens, request.max_tokens, True, False))
            request.emit(FinishedEvent(FinishReason.ABORT, prompt_tokens, 0, False))
        else:
            self._scheduler.abort(request)
        return True

    def _on_workers_ready(self, description: WorkerDescription) -> None:
        self._description = description
        if self._grammar_build is None:
            self._grammar_build = asyncio.get_running_loop().create_task(
                self._build_grammar(description), name="grammar service build")
        self._scheduler = scheduler_for_world(self._config, description, self._counters)
        self.not_ready_reason = ""

    async def _build_grammar(self, description: WorkerDescription) -> GrammarBackend:
        grammar = await asyncio.to_thread(self._grammar_factory, description)
        self._commands.put_nowait(lambda: setattr(self, "grammar", grammar))
        return grammar

    def _on_workers_lost(self, reason: str) -> None:
        """Fail every live request (their worker state is gone) and wait for a new handshake."""
        self.not_ready_reason = reason
        for request in list(self._requests.values()):
            self._fail_anywhere(request, ErrorKind.UNAVAILABLE, f"worker lost: {reason}")
        self._scheduler = None
        self._pipeline.clear()

    def _fail_anywhere(self, request: Request, kind: ErrorKind, message: str) -> None:
        if request.phase is RequestPhase.GRAMMAR_PENDING:
            self._compiles.pop(request.request_id).cancel()
            request.phase = RequestPhase.FINISHED
            request.emit(FailedEvent(kind, message))
        elif self._scheduler is not None:
            self._scheduler.fail(request, kind, message)

    def _release_everything(self) -> None:
        for request in list(self._requests.values()):
            self._fail_anywhere(request, ErrorKind.UNAVAILABLE, "the scheduler is shutting down")

    def close(self) -> None:
        """Stop the grammar compile pool (after the loop task ended)."""
        if self.grammar is not None:
            self.grammar.close()

    # ---- state views ------------------------------------------------------------------------
    def _snapshot(self, include_requests: bool) -> SchedulerSnapshot:
        return SchedulerSnapshot.build(self._scheduler, self._counters, self._requests.values(),
                                       self.grammar, include_requests)

    def _request_snapshot(self, request_id: str) -> Optional[RequestSnapshot]:
        request = self._requests.get(request_id)
        if request is None:
            return None
        return snapshot_request(request, self._scheduler.kv if self._scheduler else None)
