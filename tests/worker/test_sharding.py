"""Which share of the model a rank holds: topology checks, the checkpoint rows each rank reads, and
that the shares of all ranks put together are the whole model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.model.checkpoint import CheckpointReader
from services.worker.model.config import ModelConfig
from services.worker.model.parallel import ParallelLayout, TopologyError, check_topology
from services.worker.model.sharding import rank_selection
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint
from services.worker.model.tiny_presets import preset_config


@pytest.fixture(scope="module")
def ep16_config() -> ModelConfig:
    return ModelConfig.from_dict(preset_config("tiny-ep16"))


@pytest.mark.parametrize("dp, tp, ep, message", [
    (1, 3, 1, "--tp 3 does not divide the model's num_attention_heads (8)"),
    (1, 8, 1, "--tp 8 does not divide the model's o_groups (4)"),
    (2, 4, 32, "--ep 32 must divide the world size"),
    (3, 1, 3, "--ep 3 does not divide the model's n_routed_experts (16)"),
])
def test_a_topology_that_does_not_divide_the_model_is_refused(ep16_config, dp, tp, ep, message):
    with pytest.raises(TopologyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_topology(ep16_config, dp, tp, ep)


def test_guide_topology_divides_the_ep16_preset(ep16_config):
    check_topology(ep16_config, 4, 4, 16)


def test_ranks_of_a_partition_and_of_an_expert_group():
    layout = ParallelLayout(rank=6, dp=4, tp=4, ep=8)
    assert (layout.partition_id, layout.tp_rank, layout.ep_rank) == (1, 2, 6)
    assert layout.tp_group_ranks() == (4, 5, 6, 7) and layout.ep_group_ranks() == tuple(range(8))
    assert not layout.leads_partition and ParallelLayout(rank=4, dp=4, tp=4).leads_partition
    # Rank 6's group sends its tokens from rank 4; with ep 2, rank 7's EP group is {6, 7}.
    assert layout.ep_contributor(6) == 4
    assert ParallelLayout(rank=7, dp=4, tp=4, ep=2).ep_contributor(7) == 6


def test_every_rank_reads_a_disjoint_share_that_adds_up_to_the_whole(ep16_config):
    selections = [rank_selection(ep16_config, ParallelLayout(rank, 4, 4, 16)) for rank in range(16)]
    wq_b = "layers.1.attn.wq_b.weight"
    rows = sorted(r for s in selections[:4] for r in s[wq_b])
    assert rows == list(range(ep16_config.num_attention_heads * ep16_config.head_dim))
    assert selections[4][wq_b] == selections[0][wq_b]  # the next partition holds the same slices
    expert_owners = [[rank for rank, s in enumerate(selections)
                      if f"layers.2.ffn.experts.{e}.w1.weight" in s] for e in range(16)]
    assert expert_owners == [[e] for e in range(16)]
    assert all(s["layers.1.attn.wkv.weight"] is None for s in selections)  # replicated, whole


@pytest.mark.slow  # loads the checkpoint 16 times
def test_each_rank_holds_a_sixteenth_of_the_routed_experts_at_ep16(tmp_path):
    model_dir = write_tiny_checkpoint(tmp_path, preset="tiny-ep16", seed=1)
    config = ModelConfig.from_json_file(Path(model_dir) / "config.json")
    with CheckpointReader(model_dir) as reader:
        whole = reader.load_all(config, torch.float32)
        shares = [reader.load_all(
            config, torch.float32, selection=rank_selection(config, ParallelLayout(rank, 4, 4, 16)))
            for rank in range(16)]
    total = _expert_bytes(whole)
    for share in shares:
        assert abs(_expert_bytes(share) - total / 16) <= 0.1 * total / 16
    # A sliced tensor equals the same rows of the whole one (FP8 blocks cut or not).
    for rank, share in enumerate(shares[:4]):
        for name in ("layers.1.attn.wq_b.weight", "layers.1.attn.wo_b.weight"):
            rows = rank_selection(config, ParallelLayout(rank, 4, 4, 16))[name]
            assert torch.equal(share[name], whole[name][rows.start:rows.stop])


def _expert_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for name, t in tensors.items() if ".experts." in name)
