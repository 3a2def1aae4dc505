"""The step loop's view of `grammar.py`: building the service and compiling one request's
constraint, with grammar failures turned into INVALID_ARGUMENT rejections."""
from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from services.common.config import SchedulerConfig
from services.scheduler.errors import ErrorKind, SchedulerError
from services.scheduler.grammar import GrammarCompileError, GrammarService, GrammarUnavailable
from services.scheduler.requests import ConstraintSpec
from services.scheduler.worker_description import WorkerDescription

log = logging.getLogger(__name__)


class GrammarBackend(Protocol):
    """What the step loop uses of `GrammarService` (tests pass a fake)."""

    available: bool
    live_matchers: int
    cache_entries: int

    async def compile(self, kind: str, spec: str) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def close(self) -> None: ...


GrammarFactory = Callable[[WorkerDescription], GrammarBackend]


class UnavailableGrammar:
    """Stands in when the grammar service cannot be built (e.g. no tokenizer.json)."""

    available = False
    live_matchers = 0
    cache_entries = 0

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def compile(self, kind: str, spec: str) -> Any:
        raise GrammarUnavailable(self.reason)

    def matcher(self, compiled: Any) -> Any:
        raise GrammarUnavailable(self.reason)

    def close(self) -> None:
        """Nothing to stop."""


def grammar_factory(config: SchedulerConfig) -> GrammarFactory:
    """Builds the real GrammarService once the workers told vocab size and EOS."""
    def build(description: WorkerDescription) -> GrammarBackend:
        try:
            return GrammarService(config.model_dir, description.vocab_size,
                                  description.eos_token_id, config.grammar_compile_threads)
        except Exception as error:  # tokenizers raises a bare Exception for a missing file
            reason = (f"constrained decoding is unavailable: the grammar service could not start "
                      f"from {config.model_dir}: {error}")
            log.error("%s", reason)
            return UnavailableGrammar(reason)
    return build


async def compile_constraint(grammar: GrammarBackend, constraint: ConstraintSpec) -> Any:
    """The compiled grammar; raises SchedulerError(INVALID_ARGUMENT) when it cannot be had."""
    try:
        return await grammar.compile(constraint.kind, constraint.spec)
    except GrammarUnavailable as error:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT, str(error)) from None
    except GrammarCompileError as error:
        message = f"the {constraint.kind} constraint does not compile: {error}"
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT, message) from None
