"""The demo's DSpark variant on disk: its draft beside the committed target, expanded on use.

Compact form: `dspark.safetensors` in the target's compact directory — every draft tensor in its
stored form (FP8/FP4 with scales, bf16, f32), except the Markov head, whose `markov_w1` (bf16) and
`markov_w2` (f32) rows are stored for the trained ids only (the order of `vocab.safetensors`).

Expansion writes the target's full checkpoint (export.py) with the DSpark config
(`architecture.DRAFT_OVERRIDES`): the MTP block goes, the draft stage takes the `mtp.0.` names,
and every untrained Markov row is the mean of the trained rows. A token's draft logit is its head
logit plus its Markov logit, each for an untrained token the mean of the trained ones, so their
sum is the mean of the trained tokens' sums: an untrained token never wins the draft's argmax
either (and the target verifies every draft token).
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from services.demo.architecture import draft_config_json
from services.demo.export import (COMPACT_DIR, COMPACT_FILES, PathLike, compact_digest, full_rows,
                                  full_tensors, write_checkpoint)
from services.demo.params import quantize_for_storage, storage_kind, store_parts
from services.worker.model.checkpoint import TensorSpec
from services.worker.model.tiny_checkpoint import cache_root, materialize_once

DRAFT_FILE = "dspark.safetensors"
DSPARK_SERVED_NAME = "dsv4-demo-dspark"
MARKOV = ("mtp.0.markov_head.markov_w1.weight", "mtp.0.markov_head.markov_w2.weight")


def write_draft(out_dir: PathLike, body: dict[str, torch.Tensor], markov_rows: list[torch.Tensor],
                specs: dict[str, TensorSpec]) -> Path:
    """body: the draft's float tensors but the Markov head; markov_rows: its two [Vt, rank]
    row sets, in the order of the target's trained ids."""
    stored: dict[str, torch.Tensor] = {}
    for name, weight in body.items():
        store_parts(stored, name, quantize_for_storage(storage_kind(name, specs), weight))
    for name, rows in zip(MARKOV, markov_rows):
        stored[name] = quantize_for_storage(storage_kind(name, specs), rows)[0].contiguous()
    path = Path(out_dir) / DRAFT_FILE
    save_file(stored, str(path), metadata={"format": "pt"})
    return path


def expand_dspark(compact_dir: PathLike, out_dir: PathLike) -> Path:
    """Write the full DSpark checkpoint of a compact directory that holds a draft."""
    config_json, tensors = full_tensors(compact_dir)
    config_json = draft_config_json(config_json)
    tensors = {name: t for name, t in tensors.items() if not name.startswith("mtp.")}
    draft = load_file(str(Path(compact_dir) / DRAFT_FILE))
    ids = load_file(str(Path(compact_dir) / "vocab.safetensors"))["ids"].to(torch.int64)
    for name in MARKOV:
        draft[name] = full_rows(draft[name], ids, config_json["vocab_size"])
    return write_checkpoint(out_dir, config_json, {**tensors, **draft})


def demo_dspark_model_dir() -> Path:
    """The demo's DSpark variant, expanded on first use into the checkpoint cache beside the
    demo (keyed by the committed files' hash); the directory is named `dsv4-demo-dspark`."""
    digest = compact_digest(COMPACT_DIR, COMPACT_FILES + (DRAFT_FILE,))
    return materialize_once(cache_root() / f"demo-{digest}" / DSPARK_SERVED_NAME,
                            lambda staging: expand_dspark(COMPACT_DIR, staging))

