"""The demo checkpoint on disk: a compact form committed to git, expanded into the real format.

Compact form (`services/demo/weights/`, a few MB): `config.json`; `body.safetensors` with every
tensor of the checkpoint except the vocabulary-sized ones, already in their stored form (FP8 e4m3 +
ue8m0 scales, packed FP4 + scales, bf16, f32); `vocab.safetensors` with the trained token ids, their
`embed` and `head` rows (FP8 with their `embed_scale`/`head_scale`, params.VOCAB_FP8_BLOCK; bf16
with no scale in compacts written before) and the hash-routing table (uint8 [V, k]); `training.json` with the
step the weights are from and the settings of the run that trained them, which a run distilling a
draft from them needs to rebuild the same vocabulary and stream (draft.py).

Expansion writes a complete DeepSeek-V4 checkpoint directory (`config.json`, one safetensors shard,
its index, the tokenizer files) in which `embed.weight` and `head.weight` are [129280, D]: trained
rows where trained, every other `head` row the mean of the trained rows (see docs/demo-model.md:
such a token's logit is the mean of the trained logits, so it never wins the argmax); an untrained
token's `embed` and hash-routing rows are those of its stand-in, a trained spelling of the same
word (standins.py), or the mean `embed` row where it has none; with a `spell` matrix in
`vocab.safetensors`, an untrained spelt token's `embed` row also carries its pieces' trace.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Sequence, Union

import torch
from safetensors.torch import load_file, save_file

from services.demo.params import SPELL, served_vocab_rows
from services.demo.schedule import TrainSettings, saved_settings
from services.demo.standins import routing_ids, spelt_pieces, stand_ins, untrained_rows
from services.worker.model.checkpoint import INDEX_FILE, SCALE_SUFFIX, expected_tensors
from services.worker.model.config import ModelConfig
from services.worker.model.tiny_checkpoint import TOKENIZER_FILES, cache_root, materialize_once
from services.frontend.tokenizer import bundled_tokenizer_dir

COMPACT_DIR = Path(__file__).resolve().parent / "weights"
COMPACT_FILES = ("config.json", "body.safetensors", "vocab.safetensors")
HELDOUT_FILE = "heldout.json"
TRAINING_FILE = "training.json"
SERVED_NAME = "dsv4-demo"   # the held-out evaluation prompts of the committed model
SHARD = "model.safetensors"
VOCAB_ROWS = ("embed", "head")
ROW_SCALE_KEY = "_scale"      # `vocab.safetensors` holds `embed_scale` next to FP8 `embed` rows
PathLike = Union[str, Path]
# Bumped whenever the same compact files expand into other tensors, so that a cached expansion
# is not served in place of the new one. 2: untrained word tokens read as stand-ins (standins.py).
EXPANSION_VERSION = 2


def write_compact(out_dir: PathLike, config_json: dict, stored: dict[str, torch.Tensor],
                  vocab_ids: torch.Tensor, hash_table: torch.Tensor) -> Path:
    """stored: the checkpoint's tensors in stored form with compact `embed.weight`/`head.weight`
    rows ([Vt, D], in the order of `vocab_ids`; FP8 ones with their `.scale`) and no `tid2eid`
    tables."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_names = {f"{row}{suffix}": f"{row}{key}" for row in VOCAB_ROWS
                   for suffix, key in ((".weight", ""), (SCALE_SUFFIX, ROW_SCALE_KEY))}
    vocab_names[SPELL] = SPELL
    body = {n: t.contiguous() for n, t in stored.items() if n not in vocab_names}
    save_file(body, str(out / "body.safetensors"), metadata={"format": "pt"})
    rows = {key: stored[name].contiguous() for name, key in vocab_names.items() if name in stored}
    save_file({"ids": vocab_ids.to(torch.int32).contiguous(), **rows,
               "hash_table": hash_table.to(torch.uint8).contiguous()},
              str(out / "vocab.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
    return out


def write_training(compact_dir: PathLike, settings: TrainSettings, step: int,
                   averaged_from: Sequence[dict] = ()) -> None:
    """`training.json`: the step and settings of the weights (for an average of runs, those of
    the first run; `averaged_from` then names every run with its own step and settings)."""
    record = {"step": step, "settings": asdict(settings)}
    if averaged_from:
        record["averaged_from"] = list(averaged_from)
    (Path(compact_dir) / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n",
                                                   encoding="utf-8")


def read_training(compact_dir: PathLike) -> tuple[TrainSettings, int]:
    """The settings that trained a compact checkpoint's weights and the step they are from."""
    record = json.loads((Path(compact_dir) / TRAINING_FILE).read_text(encoding="utf-8"))
    return saved_settings(record["settings"]), record["step"]


def expand(compact_dir: PathLike, out_dir: PathLike) -> Path:
    """Write the full real-format checkpoint of a compact directory into `out_dir`."""
    return write_checkpoint(out_dir, *full_tensors(compact_dir))


def full_tensors(compact_dir: PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """The compact directory's config.json and every tensor of its full checkpoint."""
    compact = Path(compact_dir)
    config_json = json.loads((compact / "config.json").read_text(encoding="utf-8"))
    config = ModelConfig.from_dict(config_json)
    tensors = load_file(str(compact / "body.safetensors"))
    vocab = load_file(str(compact / "vocab.safetensors"))
    ids = vocab["ids"].to(torch.int64)
    rows = {name: trained_rows(vocab, name) for name in VOCAB_ROWS}
    for name in VOCAB_ROWS:
        tensors[f"{name}.weight"] = full_rows(rows[name], ids, config.vocab_size, torch.bfloat16)
    table = vocab["hash_table"].to(torch.int64)
    read_untrained_as_stand_ins(tensors, rows["embed"], tuple(ids.tolist()), table,
                                vocab[SPELL].float() if SPELL in vocab else None)
    for name in expected_tensors(config):
        if name.endswith("gate.tid2eid"):
            tensors[name] = table
    return config_json, tensors


def read_untrained_as_stand_ins(tensors: dict[str, torch.Tensor], embed_rows: torch.Tensor,
                                trained_ids: tuple[int, ...], table: torch.Tensor,
                                spell: torch.Tensor | None = None) -> None:
    """Untrained word tokens take their stand-in's `embed` and hash-routing rows (or, spelt
    ones without a stand-in, the mean row and their first piece's routing), plus with `spell`
    a spelt token's trace (standins.py); `head` keeps the mean, so they still never win the
    argmax."""
    spelt = set(spelt_pieces(trained_ids)) if spell is not None else set()
    untrained = sorted(set(stand_ins(trained_ids)) | (spelt - set(trained_ids)))
    embed = tensors["embed.weight"]
    embed[untrained] = untrained_rows(embed_rows, trained_ids, untrained, spell).to(embed.dtype)
    table[untrained] = table[routing_ids(trained_ids, untrained, spell is not None)]


def trained_rows(vocab: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """float32 [Vt, D]: the trained `embed` or `head` rows of a loaded `vocab.safetensors`."""
    return served_vocab_rows(vocab[name], vocab.get(name + ROW_SCALE_KEY))


def full_rows(trained: torch.Tensor, ids: torch.Tensor, vocab_size: int,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """[V, D] in `dtype` (default: the trained rows'): the trained rows at their ids (exact in
    `dtype`), the mean of the trained rows everywhere else."""
    dtype = dtype or trained.dtype
    mean = trained.float().mean(dim=0).to(dtype)
    rows = mean.expand(vocab_size, -1).clone()
    rows[ids] = trained.to(dtype)
    return rows


def write_checkpoint(out_dir: PathLike, config_json: dict, tensors: dict[str, torch.Tensor]
                     ) -> Path:
    """One shard + index + config + tokenizer files; every expected tensor must be present."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    expected = expected_tensors(ModelConfig.from_dict(config_json))
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"checkpoint tensors missing: {missing[:5]}")
    ordered = {name: tensors[name].contiguous() for name in expected}
    save_file(ordered, str(out / SHARD), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in ordered.values())
    index = {"metadata": {"total_size": total}, "weight_map": {name: SHARD for name in sorted(ordered)}}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
    for name in TOKENIZER_FILES:
        shutil.copyfile(bundled_tokenizer_dir() / name, out / name)
    return out


def compact_digest(compact_dir: PathLike = COMPACT_DIR,
                   files: tuple[str, ...] = COMPACT_FILES) -> str:
    """The cache key of an expansion: the compact files and EXPANSION_VERSION."""
    digest = hashlib.sha256(f"expansion {EXPANSION_VERSION}".encode())
    for name in files:
        digest.update((Path(compact_dir) / name).read_bytes())
    return digest.hexdigest()[:12]


def default_demo_model_dir() -> Path:
    """The trained demo model (the default model), expanded on first use into the checkpoint
    cache (`$DSV4SERVE_CACHE` or ~/.cache/dsv4serve), in a folder keyed by the committed files'
    hash. The directory itself is named `dsv4-demo`, the served model name by default."""
    return materialize_once(cache_root() / f"demo-{compact_digest()}" / SERVED_NAME,
                            lambda staging: expand(COMPACT_DIR, staging))
