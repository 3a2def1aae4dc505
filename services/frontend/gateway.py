"""The per-process state behind every route (tokenizer, limits, scheduler client, metrics), and the
CPU-bound steps between a validated request and `Scheduler.Generate`: render, bound, constrain,
tokenize."""
from __future__ import annotations

import json
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import grpc

from services.common.config import FrontendConfig
from services.frontend.chat_format import render_chat_request
from services.frontend.constraints import Constraint, build_constraint
from services.frontend.dsv4_tokens import BOS
from services.frontend.errors import RequestError
from services.frontend.metrics import FrontendMetrics, RequestTimer
from services.frontend.openai_request import GenerationParams, RequestLimits
from services.frontend.response_bodies import ResponseHeader
from services.frontend.responses import AdmittedGeneration
from services.frontend.generation_stream import GenerationStream
from services.frontend.scheduler_client import SchedulerClient
from services.frontend.scheduler_errors import SchedulerError
from services.frontend.scheduler_values import GenerationSpec, ModelInfo
from services.frontend.stop_strings import StoppingDecoder
from services.frontend.tokenizer import Dsv4Tokenizer

log = logging.getLogger(__name__)

# Retry-After of a request refused because this frontend is stopping (its replicas are not).
SHUTDOWN_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class PreparedPrompt:
    token_ids: list[int]
    thinking: bool = False
    constraint: Optional[Constraint] = None


class Gateway:
    """Owns the per-process state every route uses: tokenizer, limits, scheduler client, metrics."""

    def __init__(self, config: FrontendConfig, scheduler: Optional[SchedulerClient],
                 tokenizer: Optional[Dsv4Tokenizer]) -> None:
        self.config = config
        self.tokenizer = tokenizer or Dsv4Tokenizer(config.model_dir)
        model_config = json.loads((Path(config.model_dir) / "config.json").read_text())
        self.limits = RequestLimits(config.served_model_name,
                                    int(model_config.get("vocab_size", self.tokenizer.vocab_size)),
                                    config.generate_defaults.temperature, config.bounds.max_tools,
                                    config.bounds.max_json_depth)
        self.metrics = FrontendMetrics(config.served_model_name)
        self._scheduler = scheduler
        self._owns_scheduler = scheduler is None
        self._model_info: Optional[ModelInfo] = None
        self.draining = False  # a graceful stop began: new generations are refused
        self._live: weakref.WeakSet[GenerationStream] = weakref.WeakSet()

    @property
    def scheduler(self) -> SchedulerClient:
        assert self._scheduler is not None, "the app's lifespan has not started"
        return self._scheduler

    async def open(self) -> None:
        if self._scheduler is None:
            self._scheduler = SchedulerClient(self.config.scheduler_address, self.config.ops.tls,
                                              self.config.request_timeout_s)

    async def close(self) -> None:
        if self._owns_scheduler and self._scheduler is not None:
            await self._scheduler.close()
            self._scheduler = None

    async def model_info(self) -> ModelInfo:
        """The scheduler's model facts, fetched once and cached (they never change)."""
        if self._model_info is None:
            self._model_info = await self.scheduler.get_model_info()
        return self._model_info

    def prepare_chat(self, body: dict[str, Any], max_model_len: int) -> PreparedPrompt:
        """Render + bound + constraint + tokenize. CPU-bound: run it in a worker thread."""
        rendered = render_chat_request(body, self.limits.max_json_depth)
        self.check_prompt_length(rendered.text, max_model_len, "messages")
        constraint = build_constraint(body, rendered.thinking, self.config.bounds.schema)
        token_ids = self.tokenizer.encode_prompt(rendered.text, rendered.markup_spans)
        return PreparedPrompt(token_ids, rendered.thinking, constraint)

    def encode_chat_prompt(self, body: dict[str, Any], max_model_len: int) -> list[int]:
        """The prompt ids alone (for /tokenize: no constraint is built). Run it in a thread."""
        rendered = render_chat_request(body, self.limits.max_json_depth)
        self.check_prompt_length(rendered.text, max_model_len, "messages")
        return self.tokenizer.encode_prompt(rendered.text, rendered.markup_spans)

    def encode_text_prompt(self, text: str, add_bos: bool, max_model_len: int) -> list[int]:
        """A raw prompt (the client writes the template: control tokens are matched); BOS is
        prepended unless the text already starts with it."""
        self.check_prompt_length(text, max_model_len, "prompt")
        ids = self.tokenizer.encode(text)
        if add_bos and not text.startswith(BOS):
            ids = [self.tokenizer.bos_token_id, *ids]
        return ids

    def check_prompt_length(self, text: str, max_model_len: int, param: str) -> None:
        """Refuses, before tokenizing, a prompt too long for `max_model_len` on its byte count
        alone: no token stands for more than `max_token_bytes` bytes, so this never refuses a
        prompt that fits (and bounds the work of tokenizing one that does not)."""
        size = len(text.encode("utf-8"))
        if size > max_model_len * self.tokenizer.max_token_bytes:
            raise RequestError(f"The prompt is {size} bytes: more than max_model_len "
                               f"({max_model_len}) tokens of at most "
                               f"{self.tokenizer.max_token_bytes} bytes each.", param)

    def begin_shutdown(self) -> None:
        self.draining = True

    def cut_off_live(self) -> None:
        """End of the shutdown grace: end every generation still running with an error."""
        message = "the server is shutting down and the request did not finish within its grace period"
        cut = sum(stream.cut_off(message) for stream in list(self._live))
        self.metrics.count_cut_at_shutdown(cut)
        log.warning("shutdown grace over: ended %d running request(s) with an error", cut)

    async def admit(self, header: ResponseHeader, prompt: PreparedPrompt, params: GenerationParams,
                    timer: RequestTimer, request_id: str) -> AdmittedGeneration:
        """Starts `Generate` and waits for admission; `SchedulerError` when refused."""
        if self.draining:
            self.metrics.count_rejected("shutting_down")
            raise SchedulerError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down",
                                 retry_after_s=SHUTDOWN_RETRY_AFTER_S)
        max_tokens = params.max_tokens or self.config.generate_defaults.max_new_tokens
        spec = GenerationSpec(header.response_id, prompt.token_ids, max_tokens, params.logit_bias,
                              params.ignore_eos, prompt.constraint)
        stream = self.scheduler.generate(spec, request_id)
        self._live.add(stream)
        try:
            admission = await stream.admitted()
        except BaseException:
            stream.cancel()
            raise
        decoder = StoppingDecoder(self.tokenizer.detokenizer(), self.tokenizer.eos_token_id,
                                  params.stop)
        log.info("%s: admitted (%d prompt tokens, max_tokens %d)", header.response_id,
                 admission.prompt_tokens, admission.max_tokens, extra={"request_id": request_id})
        return AdmittedGeneration(stream, admission, header, decoder, self.metrics, timer,
                                  request_id)
