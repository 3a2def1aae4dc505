"""The DSpark drafter: checkpoint format and validation, taps, draft math, batching, state."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from services.worker.model.checkpoint import CheckpointError
from services.worker.model.checkpoint_specs import expected_tensors
from services.worker.model.collectives import LocalCollectives
from services.worker.model.config import ModelConfig
from services.worker.model.config_fields import ConfigError
from services.worker.model.drafter import Draft, DraftRequest
from services.worker.model.dspark import DSparkDrafter, window_bytes
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint
from services.worker.model.tiny_presets import preset_config
from tests.worker import dspark_reference
from tests.worker.dspark_ranks import draft_on_layout

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def dspark_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-dspark"), "tiny-dspark", seed=1)


def load(model_dir: Path) -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(model_dir, torch.float32, "cpu", BLOCK_SIZE, 16))


@pytest.fixture(scope="module")
def runtime(dspark_dir: Path) -> ModelRuntime:
    return load(dspark_dir)


def prefill_taps(runtime: ModelRuntime, seq_id: int, ids: list[int], taps: tuple[int, ...],
                 chunk: int) -> tuple[list[torch.Tensor], int]:
    """Prefill `ids` in chunks of `chunk` → (each chunk's taps, the greedy next token)."""
    tables = runtime.cache.same_table_for_every_group(list(range(4)))
    out_taps = []
    for start in range(0, len(ids), chunk):
        out = runtime.step([SequenceChunk(seq_id, start, ids[start:start + chunk], tables,
                                          sample=True)], return_taps=taps)
        out_taps.append(out.taps[0])
    return out_taps, out.sampled[0]


def observed(runtime: ModelRuntime, seq_id: int, ids: list[int], chunk: int
             ) -> tuple[DSparkDrafter, torch.Tensor, int]:
    drafter = DSparkDrafter(runtime.model)
    taps, anchor = prefill_taps(runtime, seq_id, ids, drafter.tap_layer_ids, chunk)
    start = 0
    for piece in taps:
        drafter.observe(seq_id, start, piece)
        start += piece.shape[0]
    return drafter, torch.cat(taps), anchor


def assert_same_draft(a: Draft, b: Draft) -> None:
    """Tokens exactly, confidences to float rounding: CPU GEMMs over 512-wide rows (the mHC
    mixes) round differently with 8 and 16 (padded) rows beside them."""
    assert a.tokens == b.tokens
    assert a.confidences == pytest.approx(b.confidences, abs=1e-5)


# ---- config and checkpoint ----------------------------------------------------------------------
def test_dspark_stages_replace_the_mtp_tensors_with_their_extras_in_the_released_dtypes() -> None:
    config = ModelConfig.from_dict(preset_config("tiny-dspark"))
    specs = expected_tensors(config)
    dim, rank, vocab = config.hidden_size, config.dspark_markov_rank, config.vocab_size
    assert specs["mtp.0.main_proj.weight"].shape == (dim, 3 * dim)
    assert specs["mtp.0.main_proj.weight"].dtype == torch.float8_e4m3fn
    assert specs["mtp.0.main_proj.scale"].dtype == torch.float8_e8m0fnu
    assert specs["mtp.2.markov_head.markov_w1.weight"].shape == (vocab, rank)
    assert specs["mtp.2.markov_head.markov_w2.weight"].dtype == torch.float32
    assert specs["mtp.2.confidence_head.proj.weight"].shape == (1, dim + rank)
    assert "mtp.2.hc_head_fn" in specs and "mtp.0.hc_head_fn" not in specs
    assert not any(".e_proj." in name or "enorm" in name for name in specs)
    assert {f"mtp.{s}.attn.wkv.weight" for s in range(3)} <= set(specs)


@pytest.mark.parametrize("change, field", [
    ({"dspark_target_layer_ids": [1, 4, 3]}, "dspark_target_layer_ids"),
    ({"dspark_target_layer_ids": [1, 1, 3]}, "dspark_target_layer_ids"),
    ({"n_mtp_layers": 2, "compress_ratios": [0, 4, 128, 4, 0, 0]}, "n_mtp_layers"),
    ({"compress_ratios": [0, 4, 128, 4, 0, 4, 0]}, "compress_ratios"),
    ({"dspark_markov_rank": None}, "dspark_markov_rank"),
    ({"dspark_noise_token_id": 10 ** 6}, "dspark_noise_token_id"),
])
def test_an_inconsistent_dspark_config_names_the_field(change: dict, field: str) -> None:
    raw = {**preset_config("tiny-dspark"), **change}
    with pytest.raises(ConfigError, match=f"^{field}:"):
        ModelConfig.from_dict(raw)


def _copy_with(src: Path, dst: Path, config_change: dict, drop: str = "") -> Path:
    """A copy of a checkpoint (shards linked) with a changed config and an index entry dropped."""
    dst.mkdir()
    for path in src.iterdir():
        (dst / path.name).symlink_to(path)
    for name in ("config.json", "model.safetensors.index.json"):
        (dst / name).unlink()
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **config_change}))
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"].pop(drop, None)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_a_missing_dspark_tensor_is_a_startup_error_naming_it_and_the_field(
        dspark_dir: Path, tmp_path: Path) -> None:
    broken = _copy_with(dspark_dir, tmp_path / "m", {}, drop="mtp.2.markov_head.markov_w1.weight")
    with pytest.raises(CheckpointError, match=r"'mtp.2.markov_head.markov_w1.weight' is missing"
                                              r".*dspark_target_layer_ids"):
        load(broken)


def test_a_misshaped_dspark_tensor_is_a_startup_error_naming_it(dspark_dir: Path,
                                                                 tmp_path: Path) -> None:
    broken = _copy_with(dspark_dir, tmp_path / "m", {"dspark_markov_rank": 8})
    with pytest.raises(CheckpointError, match=r"'mtp.2.markov_head.markov_w1.weight'.*"
                                              r"stored shape \[129280, 16\].*expected shape "
                                              r"\[129280, 8\]"):
        load(broken)


def test_dspark_fields_on_a_checkpoint_without_the_draft_name_the_field(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    dspark_fields = {k: v for k, v in preset_config("tiny-dspark").items()
                     if k.startswith("dspark") or k in ("n_mtp_layers", "compress_ratios")}
    broken = _copy_with(tiny_model_dir, tmp_path / "m", dspark_fields)
    with pytest.raises(CheckpointError, match="is missing.*dspark_target_layer_ids"):
        load(broken)
    with pytest.raises(ConfigError, match="^dspark_target_layer_ids:"):
        DSparkDrafter(load(tiny_model_dir).model)


def test_tiny_dspark_target_is_byte_identical_to_tiny_a(dspark_dir: Path,
                                                        tiny_model_dir: Path) -> None:
    with safe_open(str(dspark_dir / "model.safetensors"), "pt") as draft, \
            safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as target:
        names = [n for n in target.keys() if not n.startswith("mtp.")]
        assert names and set(names) <= set(draft.keys())
        for name in names:
            assert torch.equal(draft.get_tensor(name).view(torch.uint8),
                               target.get_tensor(name).view(torch.uint8)), name


# ---- taps ---------------------------------------------------------------------------------------
def test_taps_are_the_hc_averaged_layer_outputs_in_the_requested_order(
        runtime: ModelRuntime) -> None:
    tables = runtime.cache.same_table_for_every_group([0, 1])
    chunk = SequenceChunk(0, 0, list(range(200, 220)), tables, sample=True)
    plain = runtime.step([chunk], return_logits=True, return_hidden=True)
    tapped = runtime.step([chunk], return_logits=True, return_taps=(3, 1))
    swapped = runtime.step([chunk], return_taps=(1, 3))
    assert plain.taps == [None]
    assert torch.equal(plain.logits[0], tapped.logits[0])
    assert tapped.taps[0].shape == (20, 2, runtime.config.hidden_size)
    assert torch.allclose(tapped.taps[0][:, 0], plain.hidden[0].mean(dim=1), atol=1e-6)
    assert torch.equal(tapped.taps[0].flip(1), swapped.taps[0])


# ---- the draft ----------------------------------------------------------------------------------
def test_observe_and_propose_equal_an_independent_reference(runtime: ModelRuntime) -> None:
    cases = [(1, list(range(300, 309)), 9, 7), (2, [(17 * i) % 5000 + 3 for i in range(40)], 11, 4)]
    for seq_id, ids, chunk, k in cases:
        drafter, taps, anchor = observed(runtime, seq_id, ids, chunk)
        draft = drafter.propose([DraftRequest(seq_id, anchor, len(ids), k)])[0]
        tokens, confidences = dspark_reference.draft(runtime.model, taps, anchor, k)
        assert draft.tokens == tokens
        assert draft.confidences == pytest.approx(confidences, abs=1e-5)
        assert all(0.0 <= c <= 1.0 for c in draft.confidences)


def test_batched_propose_equals_one_request_at_a_time(runtime: ModelRuntime) -> None:
    drafter = DSparkDrafter(runtime.model)
    requests = []
    for seq_id, length, k in ((3, 5, 7), (4, 30, 3), (5, 17, 5)):
        ids = [(31 * i + seq_id) % 9000 + 7 for i in range(length)]
        taps, anchor = prefill_taps(runtime, seq_id, ids, drafter.tap_layer_ids, 32)
        drafter.observe(seq_id, 0, taps[0])
        requests.append(DraftRequest(seq_id, anchor, length, k))
    batched = drafter.propose(requests)
    for together, request in zip(batched, requests):
        assert_same_draft(together, drafter.propose([request])[0])
    assert [len(d.tokens) for d in batched] == [7, 3, 5]


def test_a_large_markov_head_chains_its_choices_left_to_right(dspark_dir: Path) -> None:
    runtime = load(dspark_dir)
    w1 = runtime.weights["mtp.2.markov_head.markov_w1.weight"]
    w2 = runtime.weights["mtp.2.markov_head.markov_w2.weight"]
    anchor, chain = 5, [1000, 2000, 3000, 4000]
    w1.zero_()
    w2.zero_()
    for step, (prev, nxt) in enumerate(zip([anchor] + chain, chain)):
        w1[prev, step] = 1.0
        w2[nxt, step] = 1e4
    drafter, _, _ = observed(runtime, 6, list(range(40, 60)), 20)
    assert drafter.propose([DraftRequest(6, anchor, 20, 4)])[0].tokens == chain


def test_a_sharded_layout_drafts_what_one_rank_drafts_while_a_partition_idles(
        runtime: ModelRuntime, dspark_dir: Path) -> None:
    """dp 2 × tp 2, ep 4: heads split over the TP pair, experts over all four ranks; partition 1
    has no sequence and joins the expert exchange with no rows."""
    prompt = [(7 * i) % 3000 + 5 for i in range(21)]
    drafter, _, anchor = observed(runtime, 12, prompt, 32)
    alone = drafter.propose([DraftRequest(12, anchor, len(prompt), 5)])[0]
    assert_same_draft(draft_on_layout(dspark_dir, 2, 2, 4, prompt, 5), alone)


# ---- state --------------------------------------------------------------------------------------
def test_state_is_bounded_by_the_window_and_freed_by_release(runtime: ModelRuntime) -> None:
    drafter = DSparkDrafter(runtime.model)
    window = runtime.config.sliding_window
    ids = [(13 * i) % 7000 + 11 for i in range(3 * window + 5)]
    taps, anchor = prefill_taps(runtime, 7, ids, drafter.tap_layer_ids, 64)
    for start in range(0, len(ids), 6):
        drafter.observe(7, start, taps[0][start:start + 6])
        held = drafter.context_positions(7)
        assert len(held) == min(window, start + 6, len(ids)) and held.stop == min(start + 6,
                                                                                  len(ids))
    assert drafter.held_bytes == window_bytes(runtime.config, torch.float32)  # the most held
    drafter.observe(8, 0, taps[0][:3])
    assert drafter.live_sequences == 2
    drafter.release(7)
    drafter.release(8)
    drafter.release(8)
    assert drafter.live_sequences == 0 and len(drafter.context_positions(7)) == 0


def test_a_rewrite_replaces_the_positions_from_its_start(runtime: ModelRuntime) -> None:
    drafter, taps, anchor = observed(runtime, 9, list(range(500, 520)), 20)
    request = DraftRequest(9, anchor, 20, 3)
    before = drafter.propose([request])
    drafter.observe(9, 12, taps[12:] * 3.0)
    assert drafter.context_positions(9) == range(4, 20)
    assert drafter.propose([request]) != before
    drafter.observe(9, 12, taps[12:])
    assert_same_draft(drafter.propose([request])[0], before[0])


def test_proposing_without_the_context_before_the_anchor_names_the_sequence(
        runtime: ModelRuntime) -> None:
    drafter, _, anchor = observed(runtime, 10, list(range(600, 620)), 20)
    with pytest.raises(ValueError, match="sequence 10: drafting at position 25"):
        drafter.propose([DraftRequest(10, anchor, 25, 3)])
    with pytest.raises(ValueError, match="sequence 11"):
        drafter.propose([DraftRequest(11, anchor, 4, 3)])
    with pytest.raises(ValueError, match="num_drafts"):
        drafter.propose([DraftRequest(10, anchor, 20, 0)])
    assert drafter.propose([DraftRequest(11, anchor, 0, 2)])[0].tokens


class CountingExpertCollectives(LocalCollectives):
    """One rank that behaves as an expert-parallel group of one, counting its draft passes."""

    expert_parallel = True

    def __init__(self) -> None:
        self.passes = 0

    def begin_step(self, num_tokens: int) -> None:
        self.passes += 1


def test_a_refused_request_still_joins_the_expert_collectives(dspark_dir: Path) -> None:
    """On an expert-parallel layout the other ranks enter the draft pass in this step: a request
    refused here must not leave them waiting before its error propagates."""
    collectives = CountingExpertCollectives()
    runtime = ModelRuntime(RuntimeConfig(dspark_dir, torch.float32, "cpu", BLOCK_SIZE, 16),
                           collectives=collectives)
    drafter = DSparkDrafter(runtime.model)
    with pytest.raises(ValueError, match="sequence 5: drafting at position 9"):
        drafter.propose([DraftRequest(5, 7, 9, 3)])
    assert collectives.passes == 1
    assert drafter.propose([]) == [] and collectives.passes == 2


def test_observe_rejects_taps_of_the_wrong_shape(runtime: ModelRuntime) -> None:
    drafter = DSparkDrafter(runtime.model)
    with pytest.raises(ValueError, match=r"taps must be \[n, 3, 128\]"):
        drafter.observe(1, 0, torch.zeros(4, 2, 128))
    assert drafter.live_sequences == 0
