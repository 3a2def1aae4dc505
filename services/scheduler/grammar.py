"""XGrammar in the scheduler: the compile pool and cache; it makes each request's matcher
(grammar_matcher.py).

XGrammar is imported lazily: without it the service reports `available = False` and every compile
raises `GrammarUnavailable` (constrained requests are refused; there is no unconstrained fallback).

The TokenizerInfo comes from the checkpoint's `tokenizer.json` (byte-level BPE, no prefix space,
EOS the only stop token), sized to the model's lm_head width, so no transformers tokenizer object
is built.
"""
from __future__ import annotations

import asyncio
import importlib
import re
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Union

from tokenizers import Tokenizer

from services.common.constraint_kind import ConstraintKind
from services.scheduler.grammar_matcher import RequestMatcher
from services.scheduler.raw_string_guard import LengthGuard, TokenTexts
from services.scheduler.raw_string_lift import LiftedSpec, lift_raw_string_limits

JSON_OBJECT_SCHEMA = '{"type": "object"}'
JSON_MAX_WHITESPACE = 1
DEFAULT_CACHE_ENTRIES = 256
# The cache is also bounded by size (compiled grammar + its spec text): a strict tool with 1,000
# optional integer parameters compiles to 10.9 MB (2 MB spec), so 256 distinct large grammars
# would hold gigabytes; the least recently used ones go first.
DEFAULT_CACHE_BYTES = 512 << 20
LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


class GrammarUnavailable(Exception):
    """XGrammar is not importable: constrained requests cannot be served."""


class GrammarCompileError(Exception):
    """XGrammar refused the grammar; the message is XGrammar's."""


@dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar and the raw-string length limits lifted out of it before compiling
    (raw_string_lift.py); its matchers enforce those limits themselves."""

    grammar: Any                 # xgrammar.CompiledGrammar
    lifted: LiftedSpec

    @property
    def memory_size_bytes(self) -> int:
        return int(self.grammar.memory_size_bytes)


@dataclass(frozen=True)
class CompileStats:
    compiles: int          # cold compiles that succeeded
    cache_hits: int
    total_s: float         # seconds spent in cold compiles
    max_s: float


def import_xgrammar() -> Optional[ModuleType]:
    try:
        return importlib.import_module("xgrammar")
    except (ImportError, OSError):   # OSError: its native library cannot be loaded
        return None


class GrammarService:
    """Owns the XGrammar compiler, the compiled-grammar cache and the live-matcher count."""

    def __init__(self, model_dir: Path, vocab_size: int, eos_token_id: int, threads: int,
                 cache_entries_limit: int = DEFAULT_CACHE_ENTRIES,
                 cache_bytes_limit: int = DEFAULT_CACHE_BYTES) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.live_matchers = 0
        self._xgr = import_xgrammar()
        self.available = self._xgr is not None
        self._cache: OrderedDict[tuple[int, str], Any] = OrderedDict()
        self._cache_limit = cache_entries_limit
        self._cache_bytes_limit = cache_bytes_limit
        self._entry_bytes: dict[tuple[int, str], int] = {}
        self.cache_bytes = 0
        self._pending: dict[tuple[int, str], asyncio.Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads),
                                        thread_name_prefix="grammar-compile")
        self._compiles = 0
        self._cache_hits = 0
        self._compile_total_s = 0.0
        self._compile_max_s = 0.0
        self._tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self._token_texts: Optional[TokenTexts] = None   # set with the compiler
        self._compiler = self._make_compiler(threads) if self._xgr is not None else None

    @property
    def cache_entries(self) -> int:
        return len(self._cache)

    @property
    def compile_stats(self) -> CompileStats:
        return CompileStats(self._compiles, self._cache_hits, self._compile_total_s,
                            self._compile_max_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def compile(self, kind: Union[ConstraintKind, str], spec: str) -> CompiledConstraint:
        """The compiled grammar for (kind, spec), from the cache or the thread pool.

        `kind` may also be the scheduler's lower-case name ("structural_tag", ...). Concurrent
        compiles of the same text share one compilation; a cancelled waiter does not cancel it.
        """
        if self._compiler is None:
            raise GrammarUnavailable("constrained decoding is unavailable: XGrammar is not "
                                     "importable in the scheduler")
        kind = _constraint_kind(kind)
        key = (int(kind), spec)
        if key in self._cache:
            self._cache.move_to_end(key)
            self._cache_hits += 1
            return self._cache[key]
        pending = self._pending.get(key)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = loop.run_in_executor(self._pool, self._compile_now, kind, spec)
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._store(key, done))
        else:
            self._cache_hits += 1
        compiled, _ = await asyncio.shield(pending)
        return compiled

    def matcher(self, compiled: CompiledConstraint) -> RequestMatcher:
        assert self._xgr is not None
        guard = None
        if compiled.lifted.max_chars:
            guard = LengthGuard(compiled.lifted.max_chars, compiled.lifted.invoke_names,
                                self._token_texts)
        self.live_matchers += 1
        return RequestMatcher(self._xgr, compiled.grammar, self._tokenizer, self.vocab_size,
                              self.eos_token_id, self._matcher_released, guard)

    def _matcher_released(self) -> None:
        self.live_matchers -= 1

    def _make_compiler(self, threads: int) -> Any:
        xgr = self._xgr
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        encoded = [""] * self.vocab_size
        for text, token_id in vocab.items():
            if token_id < self.vocab_size:
                encoded[token_id] = text
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=self.vocab_size,
                                 stop_token_ids=[self.eos_token_id], add_prefix_space=False)
        # For the raw-string length guard (~0.2 s here, once, rather than in a request's compile).
        self._token_texts = TokenTexts(info.decoded_vocab, self.vocab_size)
        # Our own cache keys on the spec text; XGrammar's would only duplicate it.
        return xgr.GrammarCompiler(info, max_threads=max(1, threads), cache_enabled=False)

    def _compile_now(self, kind: ConstraintKind, spec: str) -> tuple[CompiledConstraint, float]:
        """Runs in the pool: (compiled grammar, seconds). Touches no service state."""
        started = time.perf_counter()
        lifted = LiftedSpec(spec)
        try:
            if kind is ConstraintKind.STRUCTURAL_TAG:
                lifted = lift_raw_string_limits(spec)
                compiled = self._compiler.compile_structural_tag(lifted.spec)
            else:
                schema = JSON_OBJECT_SCHEMA if kind is ConstraintKind.JSON_OBJECT else spec
                compiled = self._compiler.compile_json_schema(
                    schema, any_whitespace=True, max_whitespace_cnt=JSON_MAX_WHITESPACE)
        except Exception as exc:  # XGrammar raises RuntimeError/ValueError/pydantic errors
            raise GrammarCompileError(f"grammar compile failed: {_first_line(exc)}") from exc
        return CompiledConstraint(compiled, lifted), time.perf_counter() - started

    def _store(self, key: tuple[int, str], done: asyncio.Future) -> None:
        """On the event loop when a compile ends: caches it and counts its time."""
        self._pending.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        compiled, elapsed = done.result()
        self._compiles += 1
        self._compile_total_s += elapsed
        self._compile_max_s = max(self._compile_max_s, elapsed)
        self._cache[key] = compiled
        self._entry_bytes[key] = len(key[1]) + compiled.memory_size_bytes
        self.cache_bytes += self._entry_bytes[key]
        while len(self._cache) > self._cache_limit or (
                self.cache_bytes > self._cache_bytes_limit and len(self._cache) > 1):
            evicted, _ = self._cache.popitem(last=False)
            self.cache_bytes -= self._entry_bytes.pop(evicted)


def _constraint_kind(kind: Union[ConstraintKind, str, int]) -> ConstraintKind:
    try:
        if isinstance(kind, str):
            return ConstraintKind[kind.upper()]
        return ConstraintKind(kind)
    except (KeyError, ValueError):
        raise GrammarCompileError(f"unknown constraint kind {kind!r}") from None


def _first_line(exc: BaseException) -> str:
    """XGrammar's message without its `[time] file.cc:line:` prefix, first line only."""
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return LOG_PREFIX.sub("", text)[:500]
