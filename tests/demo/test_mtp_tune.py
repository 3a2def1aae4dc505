"""Chained MTP tuning: the chain it trains is the chain `MtpDrafter` drafts with, its acceptance
count is greedy verification's, and its export changes the target's MTP block and nothing else
(a later tuning can start from that block)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from services.demo import adapter, export
from services.demo.mtp_tune import MtpTuner, MtpTuneSettings, chain_acceptance, tunings
from services.demo.warm_start import dequantized
from services.worker.model.mtp_drafter import MtpDrafter
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk

PROMPT = [0] + list(range(5, 44))


def test_the_first_chain_proposes_what_the_mtp_drafter_proposes(tiny_model_dir: Path) -> None:
    runtime = ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32,
                                         device="cpu", block_size=32, num_blocks=4))
    runtime.drafter = MtpDrafter(runtime.model, 32, 4, torch.float32, "cpu", 3)
    table = runtime.cache.same_table_for_every_group(list(range(4)))
    out = runtime.step([SequenceChunk(1, 0, PROMPT, table, sample=True, num_proposals=3)])
    proposals = out.proposals[0]
    # The sequence the drafter's chain assumed: its own proposals accepted after the bonus.
    sequence = PROMPT + [out.sampled[0], *proposals, 7]

    chain = adapter.run_mtp_chain(runtime.model, PROMPT[:10], [sequence], [len(PROMPT) - 1], 3)

    chained = [int(runtime.model.logits(streams[0][:1], prefix="mtp.0.").argmax())
               for streams in chain.streams]
    assert chained == proposals
    assert [first[0] for first in chain.first] == [39, 40, 41]


def test_a_chain_counts_as_accepted_up_to_its_first_wrong_proposal() -> None:
    def rows(*bits: int) -> torch.Tensor:
        return torch.tensor(bits, dtype=torch.bool)

    # One sequence, three chains; depth d's row i belongs to chain i (depth 3 reaches two).
    right = [[rows(1, 1, 0)], [rows(1, 0, 1)], [rows(1, 1)]]

    accepted = chain_acceptance(right)

    assert accepted == {"accepted_1": 2 / 3, "accepted_2": 1 / 3, "accepted_3": 1 / 2}


def test_tuning_changes_the_mtp_block_and_exports_the_target_otherwise_byte_for_byte(
        tmp_path: Path) -> None:
    tuner = MtpTuner(tmp_path / "tune", MtpTuneSettings(steps=2, warmup_steps=1, depth=2),
                     export.COMPACT_DIR)
    record = tuner.train_step()
    assert set(record) >= {"loss", "accepted_1", "accepted_2"}

    compact = tuner.export(tmp_path / "tune")

    tuned, committed = (load_file(str(d / "body.safetensors")) for d in (compact, export.COMPACT_DIR))
    assert set(tuned) == set(committed)
    changed = {name for name in tuned if not torch.equal(tuned[name], committed[name])}
    assert changed and all(name.startswith("mtp.0.") for name in changed)
    assert (compact / "vocab.safetensors").read_bytes() == (
        export.COMPACT_DIR / "vocab.safetensors").read_bytes()
    training = json.loads((compact / export.TRAINING_FILE).read_text())
    assert training["mtp_tuned"][-1]["steps"] == 1
    assert training["mtp_tuned"][:-1] == tunings(export.COMPACT_DIR)
    assert export.read_training(compact) == export.read_training(export.COMPACT_DIR)

    # A tuning on another target can start from this block.
    warm = MtpTuner(tmp_path / "warm", MtpTuneSettings(steps=2), export.COMPACT_DIR, compact)
    for name, master in zip(warm.names, warm.tuned):
        assert torch.equal(master, dequantized(name, tuned, warm.target.specs)), name
