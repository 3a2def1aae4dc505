"""The dequantized checkpoint tensors in the dtypes the forward pass computes with.

Precision follows the official inference code: the mHC parameters, attention sinks, compressor
weights and position biases, the router, every norm weight, the output head and DSpark's Markov
`markov_w2` and confidence head stay fp32; the projections take the compute dtype. Memory: every FP8/FP4 weight is held dequantized, i.e. 2 bytes
per parameter in bf16 (V4-Flash: ~570 GB) or 4 in fp32 — fine for the tiny checkpoints, a fused FP8
path would be needed for the real model.
"""
from __future__ import annotations

from typing import Mapping

import torch

from services.worker.model.hyper_connections import HcParams

_FP32_SUFFIXES = (
    "_fn", "_base", "_scale", "attn_sink", ".ape", "compressor.wkv.weight",
    "compressor.wgate.weight", "gate.weight", "gate.bias", "norm.weight", "head.weight",
    "markov_w2.weight", "confidence_head.proj.weight",
)


def _keeps_fp32(name: str) -> bool:
    return name.endswith(_FP32_SUFFIXES) or name.startswith("hc_head")


class ModelWeights:
    """Read-only view of the checkpoint tensors, converted once at construction."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, device: str):
        self._tensors: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            if not tensor.is_floating_point():
                self._tensors[name] = tensor.to(device=device, dtype=torch.int64)
            else:
                target = torch.float32 if _keeps_fp32(name) else dtype
                self._tensors[name] = tensor.to(device=device, dtype=target)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def resident_bytes(self, skip_prefixes: tuple[str, ...] = ()) -> int:
        """Bytes of the tensors as held (after conversion), but for names with `skip_prefixes`."""
        return sum(t.numel() * t.element_size() for name, t in self._tensors.items()
                   if not name.startswith(skip_prefixes))

    def hc(self, prefix: str, kind: str) -> HcParams:
        """mHC parameters `{prefix}hc_{kind}_{fn,base,scale}` (kind: attn, ffn or head)."""
        return HcParams(fn=self[f"{prefix}hc_{kind}_fn"], base=self[f"{prefix}hc_{kind}_base"],
                        scale=self[f"{prefix}hc_{kind}_scale"])
