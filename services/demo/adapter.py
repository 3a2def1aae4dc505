"""The one place where training calls the runtime's DeepSeek-V4 code (autograd runs through it).

`run_scene` computes a shared prefix once and then every continuation from it, the way a prefix
cache would: the prefix's full blocks are shared through the block tables, its compressor states
are handed to each continuation, and each continuation recomputes the prefix's last partial block
into blocks of its own. Every sequence goes through the model in chunks of `chunk_tokens` rows of
one forward call — the runtime computes a chunked prefill exactly like a one-shot one, and short
chunks keep the per-query key gathers (and their gradients) small.

If the runtime's interfaces change (e.g. compressor state moving into paged cache rows), this
module is the only one to adapt.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from services.worker.model.batch import build_batch
from services.worker.model.kv_cache import PagedKvCache
from services.worker.model.transformer import DeepseekV4

BLOCK_SIZE = 32
CHUNK_TOKENS = 32


@dataclass(frozen=True)
class SceneHidden:
    start_pos: int                          # position of the first row of every continuation
    hidden: list[torch.Tensor]              # per continuation: last-layer streams [n, hc, D]
    mtp_hidden: list[Optional[torch.Tensor]]  # per continuation: the MTP block's streams [n, hc, D]


def shared_length(prefix_len: int, block_size: int = BLOCK_SIZE) -> int:
    """Prefix positions computed once: whole blocks, strictly before the prefix's last token (so
    the MTP input at the last shared position, the next token, is still a prefix token)."""
    return (prefix_len - 1) // block_size * block_size


def run_scene(model: DeepseekV4, prefix: list[int], sequences: list[list[int]],
              with_mtp: bool = True) -> SceneHidden:
    """prefix: ids every sequence starts with; sequences: full ids (prefix included).

    Returns the hidden streams of positions shared_length(len(prefix)).. of every sequence and, with
    `with_mtp`, the MTP block's streams there (its input at position t: the main streams at t,
    detached, and the id at t+1; the last position, which has no next id, gets EOS).
    """
    cfg = model.config
    shared = shared_length(len(prefix))
    tables = _block_tables(shared, [len(s) for s in sequences])
    layers = {i: cfg.layer_ratio(i) for i in range(cfg.num_layers_total)}
    n_blocks = 1 + max(max(t) for t in tables)
    cache = PagedKvCache(layers, cfg.head_dim, cfg.index_head_dim, BLOCK_SIZE, n_blocks, n_blocks,
                         torch.float32, "cpu")
    states: dict = {}
    mtp_states: dict = {}
    nexts = [s[1:] + [cfg.eos_token_id] for s in sequences]
    if shared:
        prefix_hidden = model.forward_hidden(_batch([(0, prefix[:shared], 0, tables[0])]), cache,
                                             states)
        if with_mtp:
            prefix_next = _batch([(0, prefix[1:shared + 1], 0, tables[0])])
            model.mtp_forward(prefix_hidden.detach(), prefix_next.token_ids, prefix_next, cache,
                              mtp_states)
    for k in range(len(sequences)):
        states[k + 1] = dict(states.get(0, {}))   # compressor states are replaced, never mutated
    rows = [(k + 1, s[shared:], shared, tables[k]) for k, s in enumerate(sequences)]
    batch = _batch(rows)
    hidden = model.forward_hidden(batch, cache, states)
    mtp_hidden = None
    if with_mtp:
        following = _batch([(k + 1, n[shared:], shared, tables[k]) for k, n in enumerate(nexts)])
        mtp_hidden = model.mtp_forward(hidden.detach(), following.token_ids, following, cache,
                                       mtp_states)
    return SceneHidden(shared, _split(hidden, sequences, shared),
                       _split(mtp_hidden, sequences, shared) if with_mtp else [None] * len(sequences))


def _block_tables(shared: int, lengths: list[int]) -> list[list[int]]:
    """Shared blocks first, then each sequence's own blocks for positions `shared` onwards."""
    common = list(range(shared // BLOCK_SIZE))
    tables, next_block = [], len(common)
    for length in lengths:
        own = math.ceil(length / BLOCK_SIZE) - len(common)
        tables.append(common + list(range(next_block, next_block + own)))
        next_block += own
    return tables


def _batch(rows: list[tuple[int, list[int], int, list[int]]]):
    """(seq_id, ids, start_pos, table) rows → one StepBatch of consecutive CHUNK_TOKENS chunks."""
    chunks = []
    for seq_id, ids, start, table in rows:
        for offset in range(0, len(ids), CHUNK_TOKENS):
            chunks.append((seq_id, start + offset, ids[offset:offset + CHUNK_TOKENS], table, table))
    return build_batch(chunks, "cpu")


def _split(hidden: torch.Tensor, sequences: list[list[int]], shared: int) -> list[torch.Tensor]:
    sizes = [len(s) - shared for s in sequences]
    return list(torch.split(hidden, sizes))
