"""Driving one sequence through a `ModelRuntime`: chunked prefill, then greedy decodes."""
from __future__ import annotations

import torch

from services.worker.model.runtime import ModelRuntime, SequenceChunk


def prefill_and_decode(runtime: ModelRuntime, seq_id: int, tokens: list[int],
                       tables: dict[str, list[int]], chunk: int, new_tokens: int,
                       start: int = 0) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill tokens[start:] in chunks of `chunk`, then decode greedily until `new_tokens` are
    sampled → (sampled tokens, logits of every sampled step)."""
    out_tokens: list[int] = []
    logits: list[torch.Tensor] = []
    for pos in range(start, len(tokens), chunk):
        piece = tokens[pos:pos + chunk]
        last = pos + len(piece) == len(tokens)
        out = runtime.step([SequenceChunk(seq_id, pos, piece, tables, sample=last)],
                           return_logits=last)
        if last:
            out_tokens.append(out.sampled[0])
            logits.append(out.logits[0])
    while len(out_tokens) < new_tokens:
        pos = len(tokens) + len(out_tokens) - 1
        out = runtime.step([SequenceChunk(seq_id, pos, [out_tokens[-1]], tables, sample=True)],
                           return_logits=True)
        out_tokens.append(out.sampled[0])
        logits.append(out.logits[0])
    return out_tokens, logits
