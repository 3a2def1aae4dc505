"""An in-process fake Scheduler (grpc.aio, 127.0.0.1:0) and helpers to serve the gateway under test.

The fake plays scripted generations: each `Generate` call takes the next queued `Script` (or a
default one) and streams the script's text as real V4 token ids, one `TokenDelta` per
`tokens_per_delta` ids. It records every request, every cancellation seen by the servicer and every
`Abort`, so tests can check what the gateway sent and that a disconnect cancelled the call.

The fake and the gateway run on separate event loops (threads), as in production they run in
separate processes; records are guarded by a condition variable that tests wait on with a deadline.
"""
from __future__ import annotations

import asyncio
import functools
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import grpc
import uvicorn

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc
from services.frontend.tokenizer import Dsv4Tokenizer, bundled_tokenizer_dir

SERVED_MODEL = "dsv4-test"
MAX_MODEL_LEN = 4096
VOCAB_SIZE = 129280


@dataclass
class Script:
    """One scripted generation."""

    text: str = "Hello there."
    # Raw output ids to send instead of the tokenized text (e.g. ids the tokenizer does not know).
    token_ids: Optional[list[int]] = None
    finish: int = pb.FINISH_REASON_STOP
    tokens_per_delta: int = 1
    # Refuse the request instead of admitting it.
    admit_error: Optional[tuple[grpc.StatusCode, str]] = None
    # After the tokens, fail the stream with this status instead of finishing.
    error_after_tokens: Optional[tuple[grpc.StatusCode, str]] = None
    # After the tokens, wait until the caller cancels (never finishes on its own).
    hold_after_tokens: bool = False


@functools.lru_cache(maxsize=1)
def shared_tokenizer() -> Dsv4Tokenizer:
    """The real V4 tokenizer, loaded once per test process (loading takes seconds)."""
    return Dsv4Tokenizer(bundled_tokenizer_dir())


def make_model_dir(root: Path) -> Path:
    """A frontend model directory: config.json + the real V4 tokenizer files."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "deepseek_v4", "vocab_size": VOCAB_SIZE, "bos_token_id": 0,
              "eos_token_id": 1}
    (root / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / name).symlink_to(bundled_tokenizer_dir() / name)
    return root


class FakeScheduler:
    def __init__(self, tokenizer: Dsv4Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ready = True
        self.ready_reason = ""
        self._scripts: deque[Script] = deque()
        self._changed = threading.Condition()
        self.requests: list[pb.GenerateRequest] = []
        self.cancelled: list[str] = []
        self.aborted: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: Optional[grpc.aio.Server] = None
        self.address = ""

    def start(self) -> str:
        self._thread.start()
        self.address = asyncio.run_coroutine_threadsafe(self._start_server(), self._loop).result(10)
        return self.address

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start_server(self) -> str:
        self._server = grpc.aio.server()
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(_Servicer(self), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return f"127.0.0.1:{port}"

    def enqueue(self, *scripts: Script) -> None:
        with self._changed:
            self._scripts.extend(scripts)

    def reset(self) -> None:
        with self._changed:
            self._scripts.clear()
            self.requests.clear()
            self.cancelled.clear()
            self.aborted.clear()
            self.ready, self.ready_reason = True, ""

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def record(self, target: list, item: object) -> None:
        with self._changed:
            target.append(item)
            self._changed.notify_all()

    def next_script(self) -> Script:
        with self._changed:
            return self._scripts.popleft() if self._scripts else Script()


class _Servicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, fake: FakeScheduler) -> None:
        self._fake = fake

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        fake = self._fake
        script = fake.next_script()
        fake.record(fake.requests, request)
        if script.admit_error:
            await context.abort(*script.admit_error)
        ids, reason = self._planned_tokens(script, request)
        try:
            yield pb.GenerateResponse(admitted=pb.Admitted(
                prompt_tokens=len(request.prompt_token_ids), max_tokens=request.sampling.max_tokens,
                constrained=request.constraint.type != pb.CONSTRAINT_TYPE_NONE))
            for start in range(0, len(ids), script.tokens_per_delta):
                yield pb.GenerateResponse(tokens=pb.TokenDelta(
                    token_ids=ids[start:start + script.tokens_per_delta]))
            if script.error_after_tokens:
                await context.abort(*script.error_after_tokens)
            if script.hold_after_tokens:
                await asyncio.Event().wait()
            yield pb.GenerateResponse(finished=pb.Finished(
                reason=reason, prompt_tokens=len(request.prompt_token_ids), completion_tokens=len(ids)))
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled while awaiting (CancelledError) or while suspended at a `yield` (the server
            # closes the generator: GeneratorExit).
            fake.record(fake.cancelled, request.request_id)
            raise

    def _planned_tokens(self, script: Script, request: pb.GenerateRequest) -> tuple[list[int], int]:
        """The script's ids (+ EOS when it stops on EOS), cut at max_tokens like the scheduler."""
        ids = list(script.token_ids) if script.token_ids is not None \
            else self._fake.tokenizer.encode(script.text)
        reason = script.finish
        if reason == pb.FINISH_REASON_STOP:
            ids.append(self._fake.tokenizer.eos_token_id)
        if request.sampling.HasField("max_tokens") and len(ids) > request.sampling.max_tokens:
            ids, reason = ids[:request.sampling.max_tokens], pb.FINISH_REASON_LENGTH
        return ids, reason

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        self._fake.record(self._fake.aborted, request.request_id)
        return pb.AbortResponse(found=True)

    async def GetModelInfo(self, request, context) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(served_model_name=SERVED_MODEL, max_model_len=MAX_MODEL_LEN,
                                       vocab_size=VOCAB_SIZE, eos_token_id=1, block_size=32,
                                       constrained_decoding_available=True)

    async def CheckReady(self, request, context) -> pb.CheckReadyResponse:
        worker = pb.WorkerStatus(address="127.0.0.1:1", connected=self._fake.ready,
                                 error=self._fake.ready_reason)
        return pb.CheckReadyResponse(ready=self._fake.ready, reason=self._fake.ready_reason,
                                     workers=[worker])

    async def GetSchedulerState(self, request, context) -> pb.GetSchedulerStateResponse:
        usage = pb.BlockGroupUsage(group="compressed", total_blocks=100, free_blocks=75, used_blocks=25,
                                   cached_blocks=40)
        return pb.GetSchedulerStateResponse(
            num_waiting=2, num_running=3, num_live_matchers=1,
            partitions=[pb.PartitionUsage(partition_id=0, groups=[usage], running_requests=3,
                                          prefix_cache_queries=900, prefix_cache_hits=600)],
            preemptions_total=4, steps_total=10, prefix_cache_queries_total=900,
            prefix_cache_hits_total=600, constrained_preemptions_total=1,
            step_seconds_total=2.5, worker_forward_seconds_total=2.0)


class GatewayServer:
    """Serves an ASGI app with uvicorn on 127.0.0.1 (free port) in a background thread."""

    def __init__(self, app) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(20)
        self._sock.close()


class GatewayHarness:
    """Model dir + fake scheduler + the gateway app served by uvicorn: one per test module."""

    def __init__(self, root: Path, **config: Any) -> None:
        """`config`: FrontendConfig fields other than the model and scheduler (bounds, api_key…)."""
        from services.common.config import FrontendConfig
        from services.frontend.app import create_app

        self.model_dir = make_model_dir(root)
        self.tokenizer = shared_tokenizer()
        self.fake = FakeScheduler(self.tokenizer)
        self.fake.start()
        self.config = FrontendConfig(model_dir=self.model_dir, served_model_name=SERVED_MODEL,
                                     scheduler_address=self.fake.address, **config)
        self.server = GatewayServer(create_app(self.config, tokenizer=self.tokenizer))
        self.server.start()

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def close(self) -> None:
        self.server.stop()
        self.fake.stop()

    def sent_prompt(self, index: int = -1) -> str:
        """The prompt text of a request the gateway sent to the scheduler."""
        return self.tokenizer.decode(self.fake.requests[index].prompt_token_ids)
