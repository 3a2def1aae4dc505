"""What a partition's executor keeps per sequence, and the checks a row must pass against it.

A row is a diff (scheduler/step_rows.py): it continues its sequence at the position the executor
has cached, with the tokens it adds and the blocks it appends. A row that fails a check raises
`RowError` and fails alone; nothing of it is committed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from services.common.step_descriptors import GroupBlocks, ScheduledRow
from services.worker.row_masks import RowError, check_drafts


@dataclass(frozen=True)
class PartitionLimits:
    """What a row may reference in this partition."""

    partition_id: int
    vocab_size: int
    block_size: int
    num_blocks: int  # per block group
    block_groups: tuple[str, ...]  # the groups every sequence has a table in


@dataclass
class SequenceState:
    token_ids: list[int]  # prompt, then the output tokens committed so far
    num_computed_tokens: int
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    logit_bias: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    # The token the sequence's last row sampled, until the next row feeds it (append_last_sampled).
    last_sampled: Optional[int] = None


def appended_tokens(row: ScheduledRow, state: SequenceState) -> tuple[int, ...]:
    """The tokens the row adds to its sequence: the one its previous row sampled, when the row
    was planned before that answer, then those the scheduler sent."""
    if not row.append_last_sampled:
        return row.append_token_ids
    if state.last_sampled is None:
        raise RowError(f"row of sequence {row.seq_id} feeds its last sampled token, but its "
                       f"previous row sampled none")
    return (state.last_sampled,) + row.append_token_ids


def check_row(row: ScheduledRow, state: SequenceState, appended: tuple[int, ...],
              limits: PartitionLimits) -> None:
    """Raises `RowError` unless the row continues `state` (`appended`: the tokens it adds) with
    the blocks it needs, inside the partition's limits."""
    start, end = row.num_computed_tokens, row.num_computed_tokens + row.num_new_tokens
    if row.num_new_tokens == 0:
        raise RowError(f"row of sequence {row.seq_id} computes no tokens")
    if start != state.num_computed_tokens:
        raise RowError(f"non-contiguous position for sequence {row.seq_id}: row starts at "
                       f"{start}, {state.num_computed_tokens} positions are cached")
    check_token_ids(row.append_token_ids, "appended", limits)
    check_token_ids(row.draft_token_ids, "draft", limits)
    check_drafts(row)
    known = len(state.token_ids) + len(appended)
    if end > known:
        raise RowError(f"row of sequence {row.seq_id} needs tokens up to position {end - 1}, "
                       f"only {known} tokens are known")
    new_by_group: dict[str, GroupBlocks] = {}
    for blocks in row.new_blocks:
        _check_new_blocks(blocks, state, new_by_group, limits)
        new_by_group[blocks.group] = blocks
    for group, table in state.block_tables.items():
        _check_table_length(group, table, new_by_group.get(group),
                            end + len(row.draft_token_ids), limits.block_size)


def _check_new_blocks(blocks: GroupBlocks, state: SequenceState, seen: dict[str, GroupBlocks],
                      limits: PartitionLimits) -> None:
    if blocks.group not in state.block_tables:
        raise RowError(f"unknown block group {blocks.group!r}")
    if blocks.group in seen:
        raise RowError(f"block group {blocks.group!r} listed twice in one row")
    out_of_range = [block for block in blocks.block_ids if block >= limits.num_blocks]
    if out_of_range:
        raise RowError(f"{blocks.group} block id {out_of_range[0]} is out of range "
                       f"(the partition has {limits.num_blocks} blocks)")
    table_len = len(state.block_tables[blocks.group])
    if blocks.first_logical_block < table_len:
        raise RowError(f"{blocks.group} blocks start at logical block "
                       f"{blocks.first_logical_block}, the table already has {table_len}")


def _check_table_length(group: str, table: list[int], new: Optional[GroupBlocks], end: int,
                        block_size: int) -> None:
    length = len(table) if new is None else new.first_logical_block + len(new.block_ids)
    needed = -(-end // block_size)
    if length < needed:
        raise RowError(f"missing {group} blocks: {end} positions need {needed} blocks, "
                       f"the table has {length}")


def check_token_ids(token_ids: tuple[int, ...], what: str, limits: PartitionLimits) -> None:
    if token_ids and max(token_ids) >= limits.vocab_size:
        raise RowError(f"{what} token id {max(token_ids)} is outside the vocabulary "
                       f"of {limits.vocab_size}")
