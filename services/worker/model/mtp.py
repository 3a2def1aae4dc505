"""One-shot MTP block evaluation (the building block speculative decoding drafts with).

`mtp_logits` runs the MTP block over a whole sequence from position 0 with a private, contiguous
cache: input = the main model's last-layer streams at positions 0..L-1 and the ids of the tokens
that follow them (prompt[1:] + [next token]).
"""
from __future__ import annotations

import math

import torch

from services.worker.model.batch import build_batch
from services.worker.model.kv_cache import PagedKvCache
from services.worker.model.transformer import DeepseekV4


def mtp_logits(model: DeepseekV4, hidden: torch.Tensor, next_ids: list[int],
               mtp_index: int = 0, block_size: int = 64) -> torch.Tensor:
    """hidden [L, hc, D], next_ids (L ids) → fp32 logits [V] of the MTP head at position L-1."""
    cfg = model.config
    layer_id = cfg.num_hidden_layers + mtp_index
    length = hidden.shape[0]
    n_blocks = math.ceil(length / block_size)
    cache = PagedKvCache({layer_id: cfg.layer_ratio(layer_id)}, cfg.head_dim, cfg.index_head_dim,
                         cfg.sliding_window, block_size, n_blocks, hidden.dtype,
                         str(hidden.device))
    tables = cache.same_table_for_every_group(list(range(n_blocks)))
    with torch.inference_mode():
        batch = build_batch([(0, 0, next_ids, tables)], str(hidden.device))
        streams = model.mtp_forward(hidden, batch.token_ids, batch, cache, mtp_index)
        return model.logits(streams[-1:], prefix=f"mtp.{mtp_index}.")[0]
