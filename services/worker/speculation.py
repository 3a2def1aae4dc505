"""Speculative decoding on the worker: is `--speculative-config` servable here, and its drafter.

Checked at startup on the host (config.json only, before any rank loads): a DSpark config on a
checkpoint without a DSpark draft and MTP on a checkpoint without an MTP layer are startup errors
that name the flag and the reason. Any layout serves speculation: every rank builds the drafter
over its share of the model and drafts in lockstep with the other ranks (drafter.py).
"""
from __future__ import annotations

from typing import Optional

from services.common.cli_values import DSPARK_METHOD, MTP_METHOD
from services.common.config import SpeculativeConfig
from services.worker.model.config import ModelConfig
from services.worker.model.drafter import Drafter


class SpeculationError(ValueError):
    """`--speculative-config` cannot be served with this checkpoint."""


def check_speculation(spec: Optional[SpeculativeConfig], model: ModelConfig) -> None:
    if spec is None or spec.num_speculative_tokens == 0:
        return
    flag = f"--speculative-config method {spec.method}"
    has_dspark = model.dspark_block_size is not None
    if spec.method == DSPARK_METHOD and not has_dspark:
        raise SpeculationError(f"{flag}: the checkpoint has no DSpark draft (no dspark_* fields "
                               f"in its config.json, no draft stages); use a DSpark checkpoint "
                               f"or method mtp")
    if spec.method == MTP_METHOD and (has_dspark or model.num_nextn_predict_layers < 1):
        raise SpeculationError(f"{flag}: the checkpoint has no MTP layer "
                               f"(num_nextn_predict_layers {model.num_nextn_predict_layers}"
                               f"{', its mtp blocks are DSpark stages' if has_dspark else ''})")


def make_drafter(spec: Optional[SpeculativeConfig], runtime) -> Optional[Drafter]:
    """The drafter of a loaded runtime (None: no speculation)."""
    if spec is None or spec.num_speculative_tokens == 0:
        return None
    if spec.method == MTP_METHOD:
        from services.worker.model.mtp_drafter import MtpDrafter

        cfg = runtime.cfg
        return MtpDrafter(runtime.model, cfg.block_size, cfg.num_blocks, cfg.dtype, cfg.device,
                          spec.num_speculative_tokens)
    from services.worker.model.dspark import DSparkDrafter  # the DSpark draft (issue 11)

    return DSparkDrafter(runtime.model)
