"""Warm start: master weights from a compact checkpoint (`export.write_compact`'s form).

A run can start from shipped weights instead of step 1 (`dsv4serve train-demo --warm-start DIR`):
every body tensor is dequantized from its stored form (FP8 blocks, FP4 rows, bf16, f32) into the
float32 master weight, so the quantization-aware forward sees exactly the stored values again
(re-quantizing a dequantized block gives back the same values; an FP4 block whose largest code is
small may come back as half the scale and doubled codes). The trained vocabulary
rows are kept as they are: the compact form stores the rows, not the tied parameters they were
built from (`vocab.py`), so each base vector and the two space directions are refitted by least
squares over the rows that share them, and the per-row deltas take the rest. The rows come out
equal to the stored ones, and weight decay on the deltas pulls, as in the original run, towards
the tied rows.

A run whose vocabulary holds more ids than the checkpoint's (composed templates add words:
`vocab.composed_vocabulary`) gives each new id the checkpoint's mean head row — its logit is the
mean of the trained ones, as for an untrained id, so it cannot win before it is learnt — and the
mean embedding row plus seeded noise of the rows' own spread, so new words read apart.

A run with more layers than the checkpoint (`train-demo --layers`) grows it: the checkpoint's
layers keep their places, and each new layer (after them, before the MTP block) starts close to
the identity, so the grown model starts where the checkpoint left off. Its output projections
(attention `wo_b`, every expert's and the shared expert's `w2`) start at a hundredth of their
seeded values, and its hyper-connection mixing starts as the identity: a layer seeded as usual
mixes the four hc copies evenly (comb base 0 → every entry ¼), which would average copies the
trained layers keep apart.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from services.demo.export import trained_rows
from services.demo.params import SPELL, DemoParameters, storage_kind
from services.demo.vocab import TrainedVocab
from services.worker.model.checkpoint import SCALE_SUFFIX, TensorSpec
from services.worker.model.dequant import DEFAULT_FP8_BLOCK, dequant_fp4_rows, dequant_fp8_blocks


def load_compact(params: DemoParameters, vocab: TrainedVocab, specs: dict[str, TensorSpec],
                 compact_dir: Path) -> torch.Tensor:
    """Overwrite `params` (in place, so an optimizer built on them keeps its references) with
    the compact checkpoint in `compact_dir`; returns its hash-routing table. Raises ValueError if
    the checkpoint's trained ids are not `vocab`'s."""
    body = load_file(str(compact_dir / "body.safetensors"))
    rows = load_file(str(compact_dir / "vocab.safetensors"))
    stored_ids = rows["ids"].to(torch.int64).tolist()
    if not set(stored_ids) <= set(vocab.ids.tolist()):
        raise ValueError(f"{compact_dir} was trained on another vocabulary "
                         f"({len(stored_ids)} ids, this run has {len(vocab)})")
    embed, head = widened_rows(vocab, stored_ids, trained_rows(rows, "embed"),
                               trained_rows(rows, "head"))
    masters = params.body_tensors()
    stored_layers = _stored_layers(compact_dir)
    if f"layers.{stored_layers - 1}.attn_norm.weight" not in masters:
        raise ValueError(f"{compact_dir} has {stored_layers} layers, more than this run's")
    grown = grown_names(masters, stored_layers)
    with torch.no_grad():
        copy_dequantized({n: m for n, m in masters.items() if n not in grown}, body, specs)
        start_as_identity({n: masters[n] for n in grown})
        if params.spell is not None and SPELL in rows:
            params.spell.copy_(rows[SPELL].float())
        _set_rows(params, vocab, embed, head)
        if params.spell is not None and SPELL not in rows:
            _add_fresh_traces(params, vocab)
    return rows["hash_table"]


# A new layer's output projections start at this share of their seeded values.
GROWN_OUTPUT_GAIN = 0.01
# The diagonal of a new layer's hc comb base: softmax(8 on the diagonal, 0 elsewhere) keeps
# 99.9% of each copy in place.
GROWN_COMB_DIAGONAL = 8.0
_GROWN_OUTPUTS = ("attn.wo_b.weight", ".w2.weight")


def _stored_layers(compact_dir: Path) -> int:
    config = json.loads((compact_dir / "config.json").read_text(encoding="utf-8"))
    return config["num_hidden_layers"]


def grown_names(masters: dict[str, torch.Tensor], stored_layers: int) -> set[str]:
    """The master tensors of layers a checkpoint of `stored_layers` layers lacks."""
    return {name for name in masters
            if (match := re.match(r"layers\.(\d+)\.", name)) and int(match[1]) >= stored_layers}


def start_as_identity(layer_tensors: dict[str, torch.Tensor]) -> None:
    """Make new layers' seeded masters (call under no_grad) start close to the identity."""
    for name, master in layer_tensors.items():
        if name.endswith(_GROWN_OUTPUTS):
            master.mul_(GROWN_OUTPUT_GAIN)
        elif name.endswith(("hc_attn_base", "hc_ffn_base")):
            hc = round((master.numel() + 1) ** 0.5) - 1     # (2 + hc) · hc entries
            master[2 * hc:] = GROWN_COMB_DIAGONAL * torch.eye(hc).flatten()


def widened_rows(vocab: TrainedVocab, stored_ids: list[int], embed: torch.Tensor,
                 head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`embed` and `head` rows (of `stored_ids`) in `vocab`'s order, with rows for the ids the
    checkpoint lacks (see the module docstring)."""
    row_of = {token_id: row for row, token_id in enumerate(stored_ids)}
    noise = torch.randn(len(vocab), embed.shape[1],
                        generator=torch.Generator().manual_seed(len(vocab))) * embed.std(dim=0)
    wide_embed = embed.mean(dim=0) + noise
    wide_head = head.mean(dim=0).expand(len(vocab), -1).clone()
    known = [n for n, token_id in enumerate(vocab.ids.tolist()) if token_id in row_of]
    source = torch.tensor([row_of[int(vocab.ids[n])] for n in known], dtype=torch.int64)
    wide_embed[known] = embed[source]
    wide_head[known] = head[source]
    return wide_embed, wide_head


def copy_dequantized(masters: dict[str, torch.Tensor], stored: dict[str, torch.Tensor],
                     specs: dict[str, TensorSpec]) -> None:
    """Set every float32 master to the values of its stored tensor (call under no_grad)."""
    for name, master in masters.items():
        master.copy_(dequantized(name, stored, specs))


def dequantized(name: str, stored: dict[str, torch.Tensor], specs: dict[str, TensorSpec]
                ) -> torch.Tensor:
    """float32 values of the stored tensor `name` (with its `.scale` companion if quantized)."""
    kind = storage_kind(name, specs)
    weight = stored[name]
    if kind == "fp8":
        scale = stored[name.removesuffix(".weight") + SCALE_SUFFIX]
        return dequant_fp8_blocks(weight, scale, DEFAULT_FP8_BLOCK, torch.float32)
    if kind == "fp4":
        return dequant_fp4_rows(weight, stored[name.removesuffix(".weight") + SCALE_SUFFIX],
                                torch.float32)
    return weight.float()


def _set_rows(params: DemoParameters, vocab: TrainedVocab, embed: torch.Tensor,
              head: torch.Tensor) -> None:
    """Tied parameters and deltas whose rows (`DemoParameters.embed_rows`/`head_rows`) are
    `embed` and `head` [Vt, D].

    embed = base + s·space_embed + Δe and head = (base + s·space_head)·g + Δh (g = D^-½, s = 1
    for a spaced token with a bare twin). The space directions are the mean spaced − bare
    difference of the twins; each base minimises |Δe|² + |Δh|² over its rows."""
    gain = params.bases.shape[1] ** -0.5
    spaced = vocab.spaced.bool()
    twin_of = {int(b): n for n, b in enumerate(vocab.base.tolist()) if not spaced[n]}
    pairs = [(n, twin_of[int(vocab.base[n])]) for n in torch.nonzero(spaced).flatten().tolist()
             if int(vocab.base[n]) in twin_of]
    space_embed = torch.zeros_like(params.space_embed)
    space_head = torch.zeros_like(params.space_head)
    if pairs:
        with_space, bare = (torch.tensor(side) for side in zip(*pairs))
        space_embed = (embed[with_space] - embed[bare]).mean(dim=0)
        space_head = (head[with_space] - head[bare]).mean(dim=0) / gain
    s = vocab.spaced[:, None]
    # Per row, the base that zeroes Δe is e − s·space_embed, the one that zeroes Δh is
    # h/g − s·space_head; weighting them 1 and g² gives the least-squares base of one row,
    # and a base's rows are averaged.
    per_row = ((embed - s * space_embed) + gain ** 2 * (head / gain - s * space_head)
               ) / (1 + gain ** 2)
    bases = torch.zeros_like(params.bases).index_add_(0, vocab.base, per_row)
    counts = torch.zeros(params.bases.shape[0]).index_add_(0, vocab.base, torch.ones(len(vocab)))
    params.bases.copy_(bases / counts[:, None])
    params.space_embed.copy_(space_embed)
    params.space_head.copy_(space_head)
    params.embed_delta.zero_()
    params.head_delta.zero_()
    # Twice: a spelt row's trace (params.DemoParameters) reads its pieces' rows, which the
    # first pass sets.
    for _ in range(2):
        params.embed_delta.add_(embed - params.embed_rows(vocab))
    params.head_delta.copy_(head - params.head_rows(vocab))


def _add_fresh_traces(params: DemoParameters, vocab: TrainedVocab) -> None:
    """A checkpoint trained without spelt tokens: their rows are its rows plus their traces
    (the fit above absorbed the traces into the deltas)."""
    params.embed_delta.add_(params.spelt_traces(params.embed_rows(vocab), vocab))
