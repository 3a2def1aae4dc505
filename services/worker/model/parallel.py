"""Where one rank sits in the world and which part of the model it holds.

World = dp × tp ranks. Rank r is tensor-parallel rank `r % tp` of data-parallel group `r // tp`;
each DP group is one cache partition (its ranks hold identical caches). Experts are split over
expert-parallel groups of `ep` consecutive ranks (ep divides the world): rank r holds routed experts
[(r % ep)·E/ep, (r % ep + 1)·E/ep).

What a TP rank holds of attention (the rest is replicated):
- `wq_b` and `attn_sink`: its H/tp heads; `wo_a`: its o_groups/tp groups (contiguous heads, so a
  rank's heads are exactly its groups' heads);
- `wo_b` [D, G·o_lora]: its D/tp output rows. The low-rank outputs of all groups are gathered first
  (each rank then multiplies the full low-rank vector by its rows) and the output slices gathered
  after. Splitting a GEMM's output rows is bit-exact on CPU, whereas the row-parallel alternative
  (partial sums over the input columns, then an all-reduce) changes the summation order: this way a
  TP layout computes exactly the numbers of the single-rank run.
"""
from __future__ import annotations

from dataclasses import dataclass

from services.worker.model.config import ModelConfig


class TopologyError(ValueError):
    """The topology does not divide the model; the message names the flag and the model field."""


@dataclass(frozen=True)
class ParallelLayout:
    rank: int = 0
    dp: int = 1
    tp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    @property
    def partition_id(self) -> int:
        """The DP group, i.e. the cache partition this rank holds."""
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def ep_rank(self) -> int:
        return self.rank % self.ep

    @property
    def leads_partition(self) -> bool:
        """TP rank 0 samples and answers for its partition."""
        return self.tp_rank == 0

    def tp_group_ranks(self) -> tuple[int, ...]:
        first = self.partition_id * self.tp
        return tuple(range(first, first + self.tp))

    def ep_group_ranks(self) -> tuple[int, ...]:
        first = self.rank - self.ep_rank
        return tuple(range(first, first + self.ep))

    def ep_contributor(self, rank: int) -> int:
        """The rank that sends `rank`'s DP group's tokens to the experts of `rank`'s EP group: the
        group's first rank inside the EP group (the group's other TP ranks hold the same tokens)."""
        return max(rank - rank % self.ep, rank - rank % self.tp)

    def heads(self, config: ModelConfig) -> range:
        return _share(config.num_attention_heads, self.tp, self.tp_rank)

    def o_groups(self, config: ModelConfig) -> range:
        return _share(config.o_groups, self.tp, self.tp_rank)

    def hidden_rows(self, config: ModelConfig) -> range:
        """This rank's output rows of `wo_b`."""
        return _share(config.hidden_size, self.tp, self.tp_rank)

    def experts(self, config: ModelConfig) -> range:
        return _share(config.n_routed_experts, self.ep, self.ep_rank)


def _share(total: int, parts: int, index: int) -> range:
    size = total // parts
    return range(index * size, (index + 1) * size)


def check_topology(config: ModelConfig, dp: int, tp: int, ep: int) -> None:
    """Raise TopologyError when --tp or --ep does not divide what it splits."""
    if (dp * tp) % ep:
        raise TopologyError(f"--ep {ep} must divide the world size --dp {dp} × --tp {tp} = "
                            f"{dp * tp}")
    for field, value in (("num_attention_heads", config.num_attention_heads),
                         ("o_groups", config.o_groups), ("hidden_size", config.hidden_size)):
        if value % tp:
            raise TopologyError(f"--tp {tp} does not divide the model's {field} ({value})")
    if config.n_routed_experts % ep:
        raise TopologyError(f"--ep {ep} does not divide the model's n_routed_experts "
                            f"({config.n_routed_experts})")
