"""Describe facts from the tiny checkpoint: capacity from the memory budget, families,
fingerprint."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from services.common.config import SpeculativeConfig, TopologyConfig, WorkerConfig
from services.worker.capacity import describe_model
from services.worker.model.config import ModelConfig
from services.worker.model.dspark import window_bytes
from services.worker.model.kv_cache import PagedKvCache
from services.worker.model.runtime import ModelRuntime
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

FAMILIES = {"ori", "cmp_c4", "cmp_c128", "idx", "csa_state", "csa_inner_state", "hca_state"}


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> ModelConfig:
    return ModelConfig.from_json_file(tiny_model_dir / "config.json")


def test_capacity_divides_the_memory_budget_by_the_cost_of_one_block_in_every_group(
        tiny_model_dir, model):
    cost = ModelRuntime.block_bytes(model, 32, torch.float32)
    per_block = sum(cost.group_block_bytes.values())
    facts = describe_model(WorkerConfig(model_dir=tiny_model_dir,
                                        kv_cache_memory_bytes=100 * per_block + 1))
    groups = {group.name: group for group in facts.block_groups}
    assert {name: group.num_blocks for name, group in groups.items()} == {
        "window": 100, "compressed": 100, "csa_state": 100, "hca_state": 100}
    assert {name: group.sliding_window for name, group in groups.items()} == {
        "window": model.sliding_window, "compressed": 0, "csa_state": 8, "hca_state": 128}
    assert {name: group.bytes_per_block for name, group in groups.items()} == \
        cost.group_block_bytes


def test_mtp_speculation_counts_its_paged_cache_in_the_memory_budget(tiny_model_dir, model):
    """The MTP drafter pages its layer's rows with the target's blocks: one block costs the
    target's groups plus what the drafter's cache allocates per block."""
    target = ModelRuntime.block_bytes(model, 32, torch.float32).all_groups_block_bytes
    mtp_layer = model.num_hidden_layers
    drafter_cache = PagedKvCache({mtp_layer: model.layer_ratio(mtp_layer)}, model.head_dim,
                                 model.index_head_dim, model.sliding_window, 32, 1,
                                 torch.float32, "cpu")
    drafter = sum(t.numel() * t.element_size() for group in drafter_cache.group_windows
                  for t in drafter_cache.storage(group))
    budget = 100 * (target + drafter) + 1
    facts = describe_model(WorkerConfig(model_dir=tiny_model_dir, kv_cache_memory_bytes=budget,
                                        speculative=SpeculativeConfig("mtp", 3)))
    assert drafter > 0 and facts.num_blocks_per_group == 100


@pytest.fixture(scope="module")
def dspark_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-dspark"), "tiny-dspark", seed=1)


def test_dspark_windows_of_max_num_seqs_sequences_come_out_of_the_memory_budget(dspark_dir):
    """Every running sequence holds each draft stage's main KV of `sliding_window` positions
    outside the blocks: the budget left for blocks is smaller by exactly that × --max-num-seqs."""
    model = ModelConfig.from_json_file(dspark_dir / "config.json")
    per_block = ModelRuntime.block_bytes(model, 32, torch.float32).all_groups_block_bytes
    window = model.num_mtp_layers * model.sliding_window * model.head_dim * 4
    budget = 100 * per_block + 5 * window
    plain = WorkerConfig(model_dir=dspark_dir, kv_cache_memory_bytes=budget, max_num_seqs=5)
    dspark = dataclasses.replace(plain, speculative=SpeculativeConfig("dspark", 3))
    assert window_bytes(model, torch.float32) == window
    assert describe_model(plain).num_blocks_per_group == 100 + 5 * window // per_block
    assert (describe_model(dspark).num_blocks_per_group, describe_model(dspark).max_num_seqs) == (
        100, 5)
    fewer_blocks = dataclasses.replace(dspark, kv_cache_memory_bytes=budget - 1)
    assert describe_model(fewer_blocks).num_blocks_per_group == 99
    with pytest.raises(ValueError, match="holds no block after .* DSpark windows"):
        describe_model(dataclasses.replace(dspark, kv_cache_memory_bytes=5 * window))


def test_num_blocks_flag_wins_over_the_budget(tiny_model_dir):
    facts = describe_model(WorkerConfig(model_dir=tiny_model_dir, num_blocks=12,
                                        kv_cache_memory_bytes=1))
    assert {group.num_blocks for group in facts.block_groups} == {12}


def test_budget_too_small_for_one_block_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="holds no block"):
        describe_model(WorkerConfig(model_dir=tiny_model_dir, kv_cache_memory_bytes=1))


def test_reports_seven_block_backed_families_vocab_eos_and_dtype(tiny_model_dir, model):
    facts = describe_model(WorkerConfig(model_dir=tiny_model_dir, num_blocks=4))
    families = {family.name: family for family in facts.cache_families}
    assert set(families) == FAMILIES
    ratio4_layers = model.compress_ratios[:model.num_hidden_layers].count(4)
    assert families["ori"].rows_per_block == 32 * model.num_hidden_layers
    assert families["cmp_c4"].rows_per_block == 8 * ratio4_layers
    assert families["csa_state"].group == "csa_state"
    assert families["csa_state"].rows_per_block == 32 * ratio4_layers
    assert families["hca_state"].group == "hca_state"
    assert sum(family.bytes_per_block for family in facts.cache_families) == sum(
        group.bytes_per_block for group in facts.block_groups)
    assert (facts.vocab_size, facts.eos_token_id) == (model.vocab_size, model.eos_token_id)
    assert facts.compute_dtype == "float32"
    cuda = WorkerConfig(model_dir=tiny_model_dir, num_blocks=4,
                        topology=TopologyConfig(backend="cuda"))
    assert describe_model(cuda).compute_dtype == "bfloat16"


def test_fingerprint_changes_with_the_model_config(tiny_model_dir, tmp_path):
    config = WorkerConfig(model_dir=tiny_model_dir, num_blocks=4)
    assert describe_model(config).model_fingerprint == describe_model(config).model_fingerprint
    other = tmp_path / "other"
    other.mkdir()
    for path in tiny_model_dir.iterdir():
        (other / path.name).symlink_to(path)
    (other / "config.json").unlink()
    text = (tiny_model_dir / "config.json").read_text().replace('"sliding_window": 16',
                                                                '"sliding_window": 32')
    assert text != (tiny_model_dir / "config.json").read_text()
    (other / "config.json").write_text(text)
    changed = dataclasses.replace(config, model_dir=other)
    assert describe_model(changed).model_fingerprint != describe_model(config).model_fingerprint
