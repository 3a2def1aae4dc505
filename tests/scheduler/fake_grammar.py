"""A fake grammar service with the interface of `services.scheduler.grammar`.

A "grammar" is a JSON list of allowed-token lists, one per output position, then EOS. A position
with exactly one allowed token is forced (returned by `forced_tokens`). The spec "refuse" compiles
to a matcher that refuses every token; invalid JSON raises GrammarCompileError.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Optional

from services.scheduler.grammar import GrammarCompileError, GrammarUnavailable
from services.scheduler.grammar_matcher import MaskRow


@dataclass(frozen=True)
class FakeCompiled:
    positions: tuple[tuple[int, ...], ...]
    refuse_all: bool = False


class FakeMatcher:
    def __init__(self, compiled: FakeCompiled, eos_token_id: int, service: "FakeGrammarService"):
        self._compiled = compiled
        self._eos = eos_token_id
        self._service = service
        self._pos = 0
        self._terminated = False
        self._released = False
        self.accepted: list[int] = []

    def _allowed(self) -> tuple[int, ...]:
        positions = self._compiled.positions
        return positions[self._pos] if self._pos < len(positions) else (self._eos,)

    def mask(self) -> MaskRow:
        allowed = sorted(self._allowed())
        return MaskRow(num_allowed=len(allowed), allowed_token_ids=allowed)

    def accept(self, token_id: int) -> bool:
        if self._compiled.refuse_all or self._terminated or token_id not in self._allowed():
            return False
        self.accepted.append(token_id)
        if self._pos >= len(self._compiled.positions):
            self._terminated = True
        self._pos += 1
        return True

    def forced_tokens(self, limit: int) -> list[int]:
        forced: list[int] = []
        positions = self._compiled.positions
        while len(forced) < limit and self._pos < len(positions) and len(positions[self._pos]) == 1:
            forced.append(positions[self._pos][0])
            self.accept(positions[self._pos][0])
        return forced

    def is_terminated(self) -> bool:
        return self._terminated

    def release(self) -> None:
        assert not self._released, "matcher released twice"
        self._released = True
        self._service.live_matchers -= 1


class FakeGrammarService:
    def __init__(self, eos_token_id: int, available: bool = True) -> None:
        self.available = available
        self.live_matchers = 0
        self.cache_entries = 0
        self._eos = eos_token_id
        self.compile_gate: Optional[asyncio.Event] = None  # set → compiles wait for it
        self.closed = False

    async def compile(self, kind: str, spec: str) -> FakeCompiled:
        if not self.available:
            raise GrammarUnavailable("constrained decoding is unavailable: XGrammar is not "
                                     "importable in the scheduler")
        if self.compile_gate is not None:
            await self.compile_gate.wait()
        if spec == "refuse":
            return FakeCompiled((), refuse_all=True)
        try:
            positions = tuple(tuple(p) for p in json.loads(spec))
        except (ValueError, TypeError) as error:
            raise GrammarCompileError(f"bad fake grammar: {error}") from None
        self.cache_entries += 1
        return FakeCompiled(positions)

    def matcher(self, compiled: FakeCompiled) -> FakeMatcher:
        self.live_matchers += 1
        return FakeMatcher(compiled, self._eos, self)

    def close(self) -> None:
        self.closed = True
