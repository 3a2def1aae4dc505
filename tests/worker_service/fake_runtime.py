"""A stand-in for `ModelRuntime` whose sampled token is a known function of the chunk it got.

Tests compute the expected token with `fake_next_token`, so a wrong position, a wrong token or a
dropped mask shows up as a wrong sampled id. It lives in a module (not a test file) because rank
processes are spawned and unpickle the factory by import path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from services.common.config import WorkerConfig
from services.worker.capacity import BlockGroupInfo, CacheFamilyInfo, ModelFacts
from services.worker.executor import StepRuntime
from services.worker.model.runtime import SequenceChunk, StepOutput

FAKE_VOCAB_SIZE = 1000
FAKE_EOS_TOKEN_ID = 1
FAKE_NUM_BLOCKS = 64
# A chunk carrying this token makes the fake rank process exit at once, as a crashed rank would.
CRASH_TOKEN_ID = 999


def fake_next_token(start_pos: int, token_ids: list[int],
                    allowed: Optional[list[int]] = None) -> int:
    """Unconstrained: mixes the chunk's end position and last token. Constrained: the largest
    allowed id (a mask that reached the runtime wins over the unconstrained answer)."""
    if allowed is not None:
        return max(allowed)
    return (start_pos + len(token_ids) + 7 * token_ids[-1]) % FAKE_VOCAB_SIZE


def allowed_ids(chunk: SequenceChunk) -> Optional[list[int]]:
    if chunk.allowed_token_ids is not None:
        return chunk.allowed_token_ids.tolist()
    if chunk.token_bitmask is not None:
        words = chunk.token_bitmask.tolist()
        return [32 * w + bit for w, word in enumerate(words) for bit in range(32)
                if (word >> bit) & 1 and 32 * w + bit < FAKE_VOCAB_SIZE]
    return None


def ranks_agree(chunks: list[SequenceChunk]) -> bool:
    """Under several ranks: a collective over the step's token count and token ids, as
    tensor-parallel compute would do; it only completes, and agrees, when every rank runs the same
    step on the same tokens."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    mine = torch.tensor([sum(len(chunk.token_ids) for chunk in chunks),
                         sum(sum(chunk.token_ids) for chunk in chunks)])
    total = mine.clone()
    dist.all_reduce(total)
    return bool((total == mine * dist.get_world_size()).all())


@dataclass
class FakeRuntime:
    steps: list[list[SequenceChunk]] = field(default_factory=list)

    def step(self, chunks: list[SequenceChunk], return_logits: bool = False) -> StepOutput:
        if any(CRASH_TOKEN_ID in chunk.token_ids for chunk in chunks):
            os._exit(3)
        self.steps.append(chunks)
        sampled = [fake_next_token(c.start_pos, c.token_ids, allowed_ids(c)) if c.sample else None
                   for c in chunks]
        error = None if ranks_agree(chunks) else "ranks computed different steps"
        # Increasing scores: a mask applied to them afterwards picks its largest allowed id, as
        # `fake_next_token` does with a mask that reached the runtime.
        if not return_logits:
            return StepOutput(sampled=sampled, logits=[None] * len(chunks),
                              errors=[error] * len(chunks))
        batch = torch.arange(FAKE_VOCAB_SIZE, dtype=torch.float32).repeat(len(chunks), 1)
        return StepOutput(sampled=sampled, logits=list(batch), errors=[error] * len(chunks),
                          logits_batch=batch, logits_row=list(range(len(chunks))))

    def release(self, seq_id: int) -> None:
        pass


@dataclass(frozen=True)
class FakeRuntimeFactory:
    # Set: `build` raises this message, as a rank that cannot load its checkpoint would.
    build_error: str = ""

    def describe(self, config: WorkerConfig) -> ModelFacts:
        groups = (BlockGroupInfo("window", FAKE_NUM_BLOCKS, 4096, 128),
                  BlockGroupInfo("compressed", FAKE_NUM_BLOCKS, 2048, 0))
        families = (CacheFamilyInfo("ori", "window", config.block_size, 4096),
                    CacheFamilyInfo("cmp_c4", "compressed", config.block_size // 4, 2048))
        return ModelFacts(vocab_size=FAKE_VOCAB_SIZE, eos_token_id=FAKE_EOS_TOKEN_ID,
                          model_fingerprint="fake-fingerprint", compute_dtype="float32",
                          block_groups=groups, cache_families=families)

    def build(self, spec: object, collectives: object) -> StepRuntime:
        if self.build_error:
            raise RuntimeError(self.build_error)
        torch.set_num_threads(1)
        return FakeRuntime()
