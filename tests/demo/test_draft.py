"""The demo's DSpark draft on disk: the exported draft expands, beside the committed target, into a
DSpark checkpoint the runtime loads with exactly the weights training computed with, the target's
tensors untouched; an untrained token never wins the draft's argmax."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from services.demo import export
from services.demo.architecture import demo_config
from services.demo.draft import (DraftParameters, draft_config, draft_specs, draft_tensors,
                                 load_draft, target_trainer)
from services.demo.draft_export import MARKOV, expand_dspark, write_draft
from services.demo.encode import SceneEncoder
from services.demo.vocab import tie_structure
from services.worker.model.checkpoint import CheckpointReader


def test_the_exported_draft_is_what_training_computed_with_beside_the_demo_target(
        tmp_path: Path) -> None:
    compact = tmp_path / "compact"
    compact.mkdir()
    for name in export.COMPACT_FILES:
        shutil.copyfile(export.COMPACT_DIR / name, compact / name)
    ids = load_file(str(compact / "vocab.safetensors"))["ids"].to(torch.int64)
    layers = export.read_training(export.COMPACT_DIR)[0].layers
    config = draft_config(layers)
    specs = draft_specs(config)
    params = DraftParameters(specs, len(ids), seed=5)
    with torch.no_grad():
        params.markov[1].normal_(generator=torch.Generator().manual_seed(5))
        trained = draft_tensors(params, specs, tie_structure(ids.tolist(), SceneEncoder()).rows())
    write_draft(compact, params.body_tensors(), [m.detach() for m in params.markov], specs)

    with CheckpointReader(expand_dspark(compact, tmp_path / "dspark")) as reader:
        served = reader.load_all(config, torch.float32)
    with CheckpointReader(export.expand(compact, tmp_path / "demo")) as reader:
        target = reader.load_all(demo_config(layers), torch.float32)
    for name, tensor in trained.items():
        assert torch.equal(served[name][ids] if name in MARKOV else served[name], tensor), name
    for name in served:
        if not name.startswith("mtp."):
            assert torch.equal(served[name], target[name]), name

    untrained = torch.ones(config.vocab_size, dtype=torch.bool)
    untrained[ids] = False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(500, config.hidden_size, generator=generator)
    prev = ids[torch.randint(len(ids), (500,), generator=generator)]
    w1, w2 = (served[name] for name in MARKOV)
    logits = x @ served["head.weight"].T + w1[prev] @ w2.T
    assert bool((logits[:, untrained].amax(dim=1) < logits[:, ~untrained].amax(dim=1)).all())


def test_the_draft_stage_reads_the_last_layer_of_a_grown_target() -> None:
    four, five = draft_config(), draft_config(5)
    assert four.dspark_target_layer_ids == (3,) and five.dspark_target_layer_ids == (4,)
    assert list(five.compress_ratios) == [0, 4, 128, 0, 0, 0]
    assert draft_specs(four).keys() == draft_specs(five).keys()


def test_a_warm_started_draft_computes_with_the_weights_of_the_draft_it_loaded(
        tmp_path: Path) -> None:
    specs = draft_specs(draft_config())
    ids = load_file(str(export.COMPACT_DIR / "vocab.safetensors"))["ids"].to(torch.int64)
    rows = tie_structure(ids.tolist(), SceneEncoder()).rows()
    trained, fresh = (DraftParameters(specs, len(ids), seed=seed) for seed in (5, 6))
    with torch.no_grad():
        trained.markov[1].normal_(generator=torch.Generator().manual_seed(5))
    path = write_draft(tmp_path, trained.body_tensors(), [m.detach() for m in trained.markov],
                       specs)
    load_draft(fresh, specs, path)
    expected, loaded = (draft_tensors(p, specs, rows) for p in (trained, fresh))
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_draft_warm_started_on_a_wider_vocabulary_keeps_its_rows_by_id(tmp_path: Path) -> None:
    """A target retrained with more trained ids: the draft's Markov rows follow their ids, and a
    new id gets the mean row (what an untrained id has at run time)."""
    specs = draft_specs(draft_config())
    ids = load_file(str(export.COMPACT_DIR / "vocab.safetensors"))["ids"].tolist()
    wider = sorted({*ids, *(t for t in range(1000, 1100) if t not in set(ids))})
    added = [n for n, t in enumerate(wider) if t not in set(ids)]
    trained, fresh = DraftParameters(specs, len(ids), seed=5), DraftParameters(specs, len(wider), 6)
    with torch.no_grad():
        trained.markov[1].normal_(generator=torch.Generator().manual_seed(5))
    path = write_draft(tmp_path, trained.body_tensors(), [m.detach() for m in trained.markov],
                       specs)
    load_draft(fresh, specs, path, (ids, wider))
    stored = load_file(str(path))
    for name, rows in zip(MARKOV, fresh.markov):
        old = stored[name].float()
        assert torch.equal(rows[[wider.index(t) for t in ids]], old), name
        assert torch.allclose(rows[added], old.mean(dim=0).expand(len(added), -1)), name


def test_the_draft_rebuilds_the_committed_targets_vocabulary_from_its_training_record(
        tmp_path: Path) -> None:
    """The draft learns from the target's own stream: its trainer must be the target's, built
    from the settings recorded beside the weights (training.json), not from a copy of them."""
    target = target_trainer(tmp_path, export.COMPACT_DIR)
    settings, step = export.read_training(export.COMPACT_DIR)
    stored = load_file(str(export.COMPACT_DIR / "vocab.safetensors"))["ids"].tolist()
    assert target.vocab.ids.tolist() == stored
    assert target.step_index == step and target.settings.fresh_composed == settings.fresh_composed
