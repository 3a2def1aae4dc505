"""The one place where training calls the runtime's DeepSeek-V4 code (autograd runs through it).

`run_scene` computes a shared prefix once and then every continuation from it, the way a prefix
cache hit resumes: the prefix's full blocks (raw kv, compressed entries and the compressors'
per-token rows) are shared through every group's block table, and each continuation recomputes
the prefix's last partial block into blocks of its own. Every sequence goes through the model in chunks of `chunk_tokens` rows of
forward calls of `CALL_TOKENS` rows — the runtime computes a chunked prefill like a one-shot one,
and short chunks and calls keep the per-query key gathers (and their gradients) small.

If the runtime's interfaces change, this module is the only one to adapt.
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
CHUNK_TOKENS = 64
CALL_TOKENS = 256


@dataclass(frozen=True)
class SceneHidden:
    start_pos: int                          # position of the first row of every continuation
    hidden: list[torch.Tensor]              # per continuation: last-layer streams [n, hc, D]
    mtp_hidden: list[Optional[torch.Tensor]]  # per continuation: the MTP block's streams [n, hc, D]
    # With tap layers: per continuation, the taps (`forward_hidden`'s) of all its positions, the
    # shared prefix's included, [len, layers, D]; what a DSpark draft reads.
    taps: Optional[list[torch.Tensor]] = None


def shared_length(prefix_len: int, block_size: int = BLOCK_SIZE) -> int:
    """Prefix positions computed once: whole blocks, strictly before the prefix's last token (so
    the MTP input at the last shared position, the next token, is still a prefix token)."""
    return (prefix_len - 1) // block_size * block_size


def run_scene(model: DeepseekV4, prefix: list[int], sequences: list[list[int]],
              with_mtp: bool = True, tap_layer_ids: tuple[int, ...] = ()) -> SceneHidden:
    """prefix: ids every sequence starts with; sequences: full ids (prefix included).

    Returns the hidden streams of positions shared_length(len(prefix)).. of every sequence and, with
    `with_mtp`, the MTP block's streams there (its input at position t: the main streams at t,
    detached, and the id at t+1; the last position, which has no next id, gets EOS).

    The shared prefix is computed without gradient: the loss is on assistant turns, which see the
    prefix through the caches, and skipping the prefix's backward saves about a quarter of a step.
    """
    cfg = model.config
    shared, tables, cache = _scene_cache(model, len(prefix), sequences)
    with torch.no_grad():
        _, _, prefix_taps = _forward([(0, prefix[:shared + 1], 0, tables[0])], model, cache,
                                     with_mtp, tap_layer_ids)
    rows = [(k + 1, s + [cfg.eos_token_id], shared, tables[k]) for k, s in enumerate(sequences)]
    main, mtp, taps = _forward(rows, model, cache, with_mtp, tap_layer_ids)
    count = range(len(sequences))
    return SceneHidden(shared, [torch.cat(main[k + 1]) for k in count],
                       [torch.cat(mtp[k + 1]) if with_mtp else None for k in count],
                       [torch.cat(prefix_taps[0] + taps[k + 1]) for k in count]
                       if tap_layer_ids else None)


def _scene_cache(model: DeepseekV4, prefix_len: int, sequences: list[list[int]]
                 ) -> tuple[int, list[list[int]], PagedKvCache]:
    """The shared length, every sequence's block table, and a cache of every layer (the MTP
    block's included) holding all of their blocks."""
    cfg = model.config
    shared = shared_length(prefix_len)
    tables = _block_tables(shared, [len(s) for s in sequences])
    layers = {i: cfg.layer_ratio(i) for i in range(cfg.num_layers_total)}
    cache = PagedKvCache(layers, cfg.head_dim, cfg.index_head_dim, cfg.sliding_window, BLOCK_SIZE,
                         1 + max(max(t) for t in tables), torch.float32, "cpu")
    return shared, tables, cache


Row = tuple[int, list[int], int, list[int]]   # seq_id, ids, first position to compute, block table


Streams = dict[int, list[torch.Tensor]]   # per seq_id: a tensor per forward call it took part in


def _forward(rows: list[Row], model: DeepseekV4, cache: PagedKvCache, with_mtp: bool,
             tap_layer_ids: tuple[int, ...] = ()) -> tuple[Streams, Streams, Streams]:
    """Positions start..len(ids)-2 of every row (ids[-1] is only the MTP's next id), in forward
    calls of at most CALL_TOKENS rows: a long sequence takes several calls, short ones share one.
    The backward pass of a call costs its rows × its chunks (every chunk's slice of a call-wide
    tensor gets a call-wide gradient), so calls stay short. → hidden and MTP streams, and the
    taps of `tap_layer_ids`, per seq_id."""
    main: Streams = {seq_id: [] for seq_id, *_ in rows}
    mtp: Streams = {seq_id: [] for seq_id, *_ in rows}
    taps: Streams = {seq_id: [] for seq_id, *_ in rows}
    for call in _pack(rows):
        batch = _batch(cache, [(seq_id, ids[a:b], a, table) for seq_id, ids, a, b, table in call])
        hidden, tapped = model.forward_hidden(batch, cache, tap_layer_ids)
        following = _batch(cache, [(seq_id, ids[a + 1:b + 1], a, table)
                            for seq_id, ids, a, b, table in call])
        streams = (model.mtp_forward(hidden.detach(), following.token_ids, following, cache)
                   if with_mtp else None)
        offset = 0
        for seq_id, _, a, b, _ in call:
            main[seq_id].append(hidden[offset:offset + b - a])
            if streams is not None:
                mtp[seq_id].append(streams[offset:offset + b - a])
            if tapped is not None:
                taps[seq_id].append(tapped[offset:offset + b - a])
            offset += b - a
    return main, mtp, taps


def _pack(rows: list[Row]) -> list[list[tuple[int, list[int], int, int, list[int]]]]:
    """Segments (seq_id, ids, begin, end, table) of at most CALL_TOKENS positions, in sequence
    order, packed greedily into calls of at most CALL_TOKENS positions."""
    calls: list[list] = [[]]
    size = 0
    for seq_id, ids, start, table in rows:
        for begin in range(start, len(ids) - 1, CALL_TOKENS):
            end = min(begin + CALL_TOKENS, len(ids) - 1)
            if size + end - begin > CALL_TOKENS and calls[-1]:
                calls.append([])
                size = 0
            calls[-1].append((seq_id, ids, begin, end, table))
            size += end - begin
    return [call for call in calls if call]


def _block_tables(shared: int, lengths: list[int]) -> list[list[int]]:
    """Shared blocks first, then each sequence's own blocks for positions `shared` onwards."""
    common = list(range(shared // BLOCK_SIZE))
    tables, next_block = [], len(common)
    for length in lengths:
        own = math.ceil(length / BLOCK_SIZE) - len(common)
        tables.append(common + list(range(next_block, next_block + own)))
        next_block += own
    return tables


def _batch(cache: PagedKvCache, rows: list[tuple[int, list[int], int, list[int]]]):
    """(seq_id, ids, start_pos, table) segments → one StepBatch of CHUNK_TOKENS chunks (one block
    table for every block group: each group's storage is allocated for all blocks)."""
    chunks = [(seq_id, start + offset, ids[offset:offset + CHUNK_TOKENS],
               cache.same_table_for_every_group(table))
              for seq_id, ids, start, table in rows for offset in range(0, len(ids), CHUNK_TOKENS)]
    return build_batch(chunks, "cpu")


@dataclass(frozen=True)
class MtpChain:
    """What `run_mtp_chain` computed for every sequence."""

    start_pos: int                 # position of hidden[k][0]
    hidden: list[torch.Tensor]     # per sequence: the target's last-layer streams (no gradient)
    first: list[list[int]]         # per depth, per sequence: position of the depth's first row
    streams: list[list[torch.Tensor]]   # per depth, per sequence: the MTP block's output streams


def run_mtp_chain(model: DeepseekV4, prefix: list[int], sequences: list[list[int]],
                  draft_from: list[int], depth: int) -> MtpChain:
    """The MTP block chained on its own streams as `MtpDrafter` drafts with, every depth over every
    position at once. Depth 1 at position p reads the target's streams at p and the id at p+1;
    depth d reads depth d-1's output at p-1 (detached) and the id at p+1, for p from
    draft_from[k] + d - 1 (the chain that starts at q reaches depth d at q + d - 1). Both predict
    the id at p+2.

    The target runs without gradient and writes the MTP block's rows of every position from its
    own streams, as the drafter observes committed positions; each depth then rewrites the rows
    of the positions it computes. So a chained row attends to rows of the target's streams over
    the prompt, as in serving, and to rows of its own depth over the completion before it (in
    serving: the target's streams up to the chain's start) — the one approximation that lets
    every chain train in one pass per depth.
    """
    cfg = model.config
    shared, tables, cache = _scene_cache(model, len(prefix), sequences)
    with torch.no_grad():
        _forward([(0, prefix[:shared + 1], 0, tables[0])], model, cache, True)
        rows = [(k + 1, s + [cfg.eos_token_id], shared, tables[k]) for k, s in enumerate(sequences)]
        main, _, _ = _forward(rows, model, cache, True)
    hidden = [torch.cat(main[k + 1]) for k in range(len(sequences))]
    firsts: list[list[int]] = []
    streams: list[list[torch.Tensor]] = []
    for d in range(depth):
        first = [start + d for start in draft_from]
        inputs = [hidden[k][a - shared:len(s) - 2 - shared] if d == 0 else
                  streams[-1][k][:len(s) - 2 - a].detach()
                  for k, (s, a) in enumerate(zip(sequences, first))]
        segments = [(k + 1, s[a + 1:len(s) - 1], a, tables[k])
                    for k, (s, a) in enumerate(zip(sequences, first))]
        streams.append(_mtp_depth(model, cache, segments, inputs))
        firsts.append(first)
    return MtpChain(shared, hidden, firsts, streams)


def _mtp_depth(model: DeepseekV4, cache: PagedKvCache,
               segments: list[tuple[int, list[int], int, list[int]]],
               inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One depth of the chain: per segment (seq_id, next ids, first position, table) and its input
    streams, the MTP block's output streams, in forward calls of at most CALL_TOKENS rows."""
    out = [inputs[k][:0] for k in range(len(segments))]
    for call in _calls([len(ids) for _, ids, _, _ in segments]):
        batch = _batch(cache, [segments[k] for k in call])
        result = model.mtp_forward(torch.cat([inputs[k] for k in call]), batch.token_ids, batch,
                                   cache)
        for k, rows in zip(call, result.split([len(segments[k][1]) for k in call])):
            out[k] = rows
    return out


def _calls(sizes: list[int]) -> list[list[int]]:
    """Indices of the non-empty sizes, in order, grouped into calls of at most CALL_TOKENS rows
    (a larger one alone)."""
    calls: list[list[int]] = [[]]
    total = 0
    for k, size in enumerate(sizes):
        if size == 0:
            continue
        if calls[-1] and total + size > CALL_TOKENS:
            calls.append([])
            total = 0
        calls[-1].append(k)
        total += size
    return [call for call in calls if call]
