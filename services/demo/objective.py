"""Losses and accuracies of one scene: next-token cross-entropy on the assistant turns only, and
the MTP head's cross-entropy on the token after next."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from services.demo.adapter import SceneHidden
from services.worker.model.transformer import DeepseekV4


@dataclass(frozen=True)
class SceneTargets:
    """Rows (in the concatenated continuation rows) and compact target ids to score."""

    rows: torch.Tensor            # next token: hidden row of position p predicts ids[p + 1]
    targets: torch.Tensor
    mtp_rows: torch.Tensor        # token after next: MTP row of position p predicts ids[p + 2]
    mtp_targets: torch.Tensor
    exact_spans: list[tuple[int, int]]   # per example: its slice of `rows`
    weights: Optional[torch.Tensor] = None       # per target (also the MTP's); None: all 1


def scene_targets(sequences: list[torch.Tensor], prompt_lengths: list[int], start: int,
                  key_tokens: Optional[list[list[bool]]] = None, key_weight: float = 1.0
                  ) -> SceneTargets:
    """sequences: compact ids of every example (prompt + completion). With `key_tokens` (per
    example, per completion token), those targets weigh `key_weight` in the loss, others 1."""
    rows, targets, mtp_rows, mtp_targets, spans = [], [], [], [], []
    offset = 0
    for ids, prompt_len in zip(sequences, prompt_lengths):
        end = ids.numel()
        positions = torch.arange(prompt_len - 1, end - 1)
        spans.append((sum(r.numel() for r in rows), sum(r.numel() for r in rows) + positions.numel()))
        rows.append(positions - start + offset)
        targets.append(ids[positions + 1])
        mtp_positions = torch.arange(prompt_len - 2, end - 2)
        mtp_rows.append(mtp_positions - start + offset)
        mtp_targets.append(ids[mtp_positions + 2])
        offset += end - start
    weights = None
    if key_tokens is not None:
        weights = 1 + (key_weight - 1) * torch.tensor([k for keys in key_tokens for k in keys],
                                                      dtype=torch.float32)
    return SceneTargets(torch.cat(rows), torch.cat(targets), torch.cat(mtp_rows),
                        torch.cat(mtp_targets), spans, weights)


def weighted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, weights: Optional[torch.Tensor]
                   ) -> torch.Tensor:
    if weights is None:
        return F.cross_entropy(logits, targets)
    return (F.cross_entropy(logits, targets, reduction="none") * weights).sum() / weights.sum()


@dataclass
class SceneScores:
    loss: torch.Tensor
    mtp_loss: torch.Tensor
    token_accuracy: float
    mtp_accuracy: float
    exact: list[bool]            # per example: every completion token is the argmax
    correct: list[list[bool]]    # per example, per completion token: it is the argmax
    num_targets: int             # completion tokens scored


def score_scene(model: DeepseekV4, hidden: SceneHidden, targets: SceneTargets) -> SceneScores:
    logits = model.logits(torch.cat(hidden.hidden)[targets.rows])
    loss = weighted_cross_entropy(logits, targets.targets, targets.weights)
    correct = logits.argmax(dim=-1) == targets.targets
    exact = [bool(correct[a:b].all()) for a, b in targets.exact_spans]
    per_token = [correct[a:b].tolist() for a, b in targets.exact_spans]
    mtp_loss, mtp_accuracy = torch.zeros(()), 0.0
    if hidden.mtp_hidden[0] is not None:
        mtp_logits = model.logits(torch.cat(hidden.mtp_hidden)[targets.mtp_rows], prefix="mtp.0.")
        # Both target lists are every example's completion tokens: the same weights apply.
        mtp_loss = weighted_cross_entropy(mtp_logits, targets.mtp_targets, targets.weights)
        mtp_accuracy = float((mtp_logits.argmax(dim=-1) == targets.mtp_targets).float().mean())
    return SceneScores(loss, mtp_loss, float(correct.float().mean()), mtp_accuracy, exact,
                       per_token, int(targets.targets.numel()))

