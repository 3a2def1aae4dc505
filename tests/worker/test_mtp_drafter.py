"""The MTP drafter: its first proposal is the MTP head's greedy token (the one-shot evaluation the
golden test checks), its chained proposals never change the committed tokens, and `release`
drops its per-sequence state."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.model.mtp import mtp_logits
from services.worker.model.mtp_drafter import MtpDrafter
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from tests.worker.chunked_runs import prefill_and_decode

BLOCKS = 4
PROMPT = [0] + list(range(5, 44))


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    runtime = ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32,
                                         device="cpu", block_size=32, num_blocks=3 * BLOCKS))
    runtime.drafter = MtpDrafter(runtime.model, 32, 3 * BLOCKS, torch.float32, "cpu", 3)
    return runtime


def tables(runtime: ModelRuntime, slot: int) -> dict[str, list[int]]:
    return runtime.cache.same_table_for_every_group(list(range(slot * BLOCKS,
                                                               (slot + 1) * BLOCKS)))


def test_first_proposal_is_the_mtp_heads_greedy_token(runtime):
    runtime.step([SequenceChunk(1, 0, PROMPT[:16], tables(runtime, 0), sample=False)])
    out = runtime.step([SequenceChunk(1, 16, PROMPT[16:], tables(runtime, 0), sample=True,
                                      num_proposals=3)], return_hidden=True)
    full = runtime.step([SequenceChunk(2, 0, PROMPT, tables(runtime, 1), sample=True)],
                        return_hidden=True)
    expected = mtp_logits(runtime.model, full.hidden[0], PROMPT[1:] + [out.sampled[0]])
    assert len(out.proposals[0]) == 3 and out.proposals[0][0] == int(expected.argmax())
    runtime.drafter.release(1)
    runtime.drafter.release(2)


def test_mtp_speculation_commits_the_k0_tokens_and_release_frees_the_state(runtime):
    drafter, runtime.drafter = runtime.drafter, None
    reference, _ = prefill_and_decode(runtime, 3, PROMPT, tables(runtime, 0), 64, 12)
    runtime.drafter = drafter
    table = tables(runtime, 2)
    out = runtime.step([SequenceChunk(4, 0, PROMPT, table, sample=True, num_proposals=3)])
    outputs, proposals = [out.sampled[0]], out.proposals[0]
    while len(outputs) < 12:
        chunk = SequenceChunk(4, len(PROMPT) + len(outputs) - 1, [outputs[-1]] + proposals, table,
                              sample=True, num_drafts=len(proposals), num_proposals=3)
        out = runtime.step([chunk])
        outputs += proposals[:out.num_accepted[0]] + [out.sampled[0]]
        proposals = out.proposals[0]
    assert outputs[:12] == reference
    assert drafter.live_sequences == 1
    drafter.release(4)
    assert drafter.live_sequences == 0
