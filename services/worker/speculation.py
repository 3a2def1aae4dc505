"""Speculative decoding on the worker: is `--speculative-config` servable here, and its drafter.

Checked at startup on the host (config.json only, before any rank loads): a DSpark config on a
checkpoint without a DSpark draft, MTP on a checkpoint without an MTP layer, and speculation on
a layout whose ranks would have to draft in lockstep (--tp > 1 or --ep > 1: the drafters run on
the rank that answers its partition, without the target's collectives) are startup errors that
name the flag and the reason.
"""
from __future__ import annotations

from typing import Optional

from services.common.cli_values import DSPARK_METHOD, MTP_METHOD
from services.common.config import SpeculativeConfig, TopologyConfig
from services.worker.model.config import ModelConfig
from services.worker.model.drafter import Drafter
from services.worker.model.parallel import ParallelLayout


class SpeculationError(ValueError):
    """`--speculative-config` cannot be served with this checkpoint or layout."""


def check_speculation(spec: Optional[SpeculativeConfig], model: ModelConfig,
                      topology: TopologyConfig) -> None:
    if spec is None or spec.num_speculative_tokens == 0:
        return
    flag = f"--speculative-config method {spec.method}"
    if topology.tp > 1 or topology.ep > 1:
        raise SpeculationError(f"{flag} with num_speculative_tokens {spec.num_speculative_tokens} "
                               f"runs on --tp 1 --ep 1 only (any --dp), got --tp {topology.tp} "
                               f"--ep {topology.ep}")
    has_dspark = model.dspark_block_size is not None
    if spec.method == DSPARK_METHOD and not has_dspark:
        raise SpeculationError(f"{flag}: the checkpoint has no DSpark draft (no dspark_* fields "
                               f"in its config.json, no draft stages); use a DSpark checkpoint "
                               f"or method mtp")
    if spec.method == MTP_METHOD and (has_dspark or model.num_nextn_predict_layers < 1):
        raise SpeculationError(f"{flag}: the checkpoint has no MTP layer "
                               f"(num_nextn_predict_layers {model.num_nextn_predict_layers}"
                               f"{', its mtp blocks are DSpark stages' if has_dspark else ''})")


def make_drafter(spec: Optional[SpeculativeConfig], runtime, layout: ParallelLayout
                 ) -> Optional[Drafter]:
    """The drafter of a loaded runtime (None: no speculation)."""
    if spec is None or spec.num_speculative_tokens == 0:
        return None
    if spec.method == MTP_METHOD:
        from services.worker.model.mtp_drafter import MtpDrafter

        cfg = runtime.cfg
        return MtpDrafter(runtime.model, cfg.block_size, cfg.num_blocks, cfg.dtype, cfg.device)
    from services.worker.model.dspark import DSparkDrafter  # the DSpark draft (issue 11)

    return DSparkDrafter(runtime.model, layout)
