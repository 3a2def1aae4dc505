"""A rank's share of the checkpoint: which tensors it reads and which rows of each.

`rank_selection` applies the split of `parallel.py` to the expected tensor list: attention's
`wq_b`/`attn_sink` by head, `wo_a` by output group and `wo_b` by output row for the rank's TP slice
(main layers and MTP blocks alike); routed experts only when the rank's EP slice holds them;
everything else whole. The reader then reads only those rows (safetensors slices), so a rank never
materialises the full model.
"""
from __future__ import annotations

import re
from typing import Optional

from services.worker.model.checkpoint_specs import SCALE_SUFFIX, expected_tensors
from services.worker.model.config import ModelConfig
from services.worker.model.parallel import ParallelLayout

_BLOCK = r"^(?:layers|mtp)\.\d+\."
_EXPERT = re.compile(_BLOCK + r"ffn\.experts\.(\d+)\.")


def rank_selection(config: ModelConfig, layout: ParallelLayout) -> dict[str, Optional[range]]:
    """Native weight name → rows this rank keeps (None: the whole tensor); absent: not loaded."""
    row_rules = _row_rules(config, layout)
    local_experts = layout.experts(config)
    selection: dict[str, Optional[range]] = {}
    for name in expected_tensors(config):
        if name.endswith(SCALE_SUFFIX):
            continue
        expert = _EXPERT.match(name)
        if expert is not None and int(expert.group(1)) not in local_experts:
            continue
        selection[name] = next((rows for pattern, rows in row_rules if pattern.match(name)), None)
    return selection


def _row_rules(config: ModelConfig, layout: ParallelLayout) -> list[tuple[re.Pattern, range]]:
    heads, groups = layout.heads(config), layout.o_groups(config)
    d, o_lora = config.head_dim, config.o_lora_rank
    return [
        (re.compile(_BLOCK + r"attn\.wq_b\.weight$"), range(heads.start * d, heads.stop * d)),
        (re.compile(_BLOCK + r"attn\.attn_sink$"), heads),
        (re.compile(_BLOCK + r"attn\.wo_a\.weight$"),
         range(groups.start * o_lora, groups.stop * o_lora)),
        (re.compile(_BLOCK + r"attn\.wo_b\.weight$"), layout.hidden_rows(config)),
    ]
