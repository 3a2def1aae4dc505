"""`DSparkDrafter`: the DSpark draft of a loaded checkpoint behind the `Drafter` interface.

It lives in the rank process beside `ModelRuntime` and computes with the runtime's own model
(`DSparkDrafter(runtime.model)`): the draft stages are the checkpoint's `mtp.s.` blocks,
the embedding and head are the target's. The worker calls `observe` with the tap-layer outputs of
every committed position (`ModelRuntime.step(..., return_taps=drafter.tap_layer_ids)`), `propose`
before a verify step, and `release` on every exit path of a sequence.

State, per sequence: each stage's main KV of the last `sliding_window` observed positions
([S, ≤W, head_dim]; Flash: 3 × 128 × 512 values), nothing else. It never grows past the window,
whatever the sequence length, and `release` drops it. Observing projects only the last W taps of a
chunk (main_proj, main_norm, S × wkv), so a long prefill costs the drafter W rows, not its length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.model.config import ModelConfig
from services.worker.model.config_fields import ConfigError
from services.worker.model.drafter import Draft, DraftRequest
from services.worker.model.dspark_draft import DraftBlock, DSparkNetwork
from services.worker.model.transformer import DeepseekV4


def window_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """The most draft state one sequence holds: every stage's main KV of `sliding_window`
    positions in the compute dtype (Flash in bf16: 3 × 128 × 512 × 2 B = 384 KiB)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return config.num_mtp_layers * config.sliding_window * config.head_dim * element_size


@dataclass(frozen=True)
class _Window:
    """Main KV [S, n, d] of positions start .. start+n-1 (n ≤ sliding_window)."""

    start: int
    kv: torch.Tensor

    @property
    def end(self) -> int:
        return self.start + self.kv.shape[1]


class DSparkDrafter:
    """Implements `drafter.Drafter` with a DSpark checkpoint's draft stages.

    Sharded layouts: the stages hold the rank's share like the target's blocks (heads by TP rank,
    experts by EP rank; `main_proj` and the heads whole) and run the model's collectives. So every
    rank of a TP group must call `propose` with the same requests, and every rank of an EP group
    must call it in the same steps — with no requests when its partition drafts nothing, exactly
    as `ModelRuntime.step` runs with no rows. `observe` and `release` are rank-local.
    """

    def __init__(self, model: DeepseekV4):
        config = model.config
        if not config.has_dspark:
            raise ConfigError("dspark_target_layer_ids: the checkpoint's config.json has no DSpark "
                              "draft (dspark_* fields and mtp.N stages); DSpark cannot run on it")
        self.tap_layer_ids: tuple[int, ...] = config.dspark_target_layer_ids
        self.window_size = config.sliding_window
        self._net = DSparkNetwork(model)
        self._hidden_size = config.hidden_size
        self._vocab_size = config.vocab_size
        self._windows: dict[int, _Window] = {}

    def _lockstep(self) -> bool:
        """Expert-parallel: every rank runs the draft passes, with zero rows when idle. Read at
        call time: a rank builds its drafter before it joins the world (DeferredCollectives)."""
        return self._net.model.collectives.expert_parallel

    @property
    def live_sequences(self) -> int:
        """Sequences holding draft state (0 after every sequence was released)."""
        return len(self._windows)

    @property
    def held_bytes(self) -> int:
        """Bytes of draft state held over every sequence (each at most `window_bytes`)."""
        return sum(w.kv.numel() * w.kv.element_size() for w in self._windows.values())

    def context_positions(self, seq_id: int) -> range:
        """The positions whose main KV is held for `seq_id` (empty when none)."""
        window = self._windows.get(seq_id)
        return range(0) if window is None else range(window.start, window.end)

    def observe(self, seq_id: int, start_pos: int, taps: torch.Tensor) -> None:
        """Committed positions start_pos .. start_pos+n-1. Positions from start_pos on replace
        what was held there; a gap after the held positions starts the window afresh."""
        expected = (len(self.tap_layer_ids), self._hidden_size)
        if taps.dim() != 3 or tuple(taps.shape[1:]) != expected:
            raise ValueError(f"sequence {seq_id}: taps must be [n, {expected[0]}, {expected[1]}], "
                             f"got {list(taps.shape)}")
        if start_pos < 0:
            raise ValueError(f"sequence {seq_id}: negative start position {start_pos}")
        if taps.shape[0] == 0:
            return
        skip = max(0, taps.shape[0] - self.window_size)
        first = start_pos + skip
        positions = torch.arange(first, start_pos + taps.shape[0], device=taps.device)
        with torch.inference_mode():
            new = _Window(first, self._net.context_kv(taps[skip:], positions))
        self._windows[seq_id] = self._joined(self._windows.get(seq_id), new)

    def _joined(self, held: _Window | None, new: _Window) -> _Window:
        """`held`'s positions before `new`, then `new`; the last W positions, in own storage."""
        if held is None or not held.start <= new.start <= held.end:
            return new
        kept = held.kv[:, :new.start - held.start]
        kv = torch.cat([kept, new.kv], dim=1)
        drop = max(0, kv.shape[1] - self.window_size)
        return _Window(held.start + drop, kv[:, drop:].clone())

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        """One batched draft pass over every request's block (a zero-row pass joining the
        expert collectives when there is none and the layout is expert-parallel)."""
        if not requests and not self._lockstep():
            return []
        try:
            blocks = [self._block(request) for request in requests]
        except ValueError:
            self._join_idle()
            raise
        with torch.inference_mode():
            proposals = self._net.propose(blocks)
        return [Draft(tokens=p.tokens.tolist(), confidences=p.confidences.tolist())
                for p in proposals]

    def _join_idle(self) -> None:
        """A refused request fails this step here, but the other ranks of an expert-parallel group
        are entering the draft pass: join it with zero rows so they are not left waiting."""
        if self._lockstep():
            with torch.inference_mode():
                self._net.propose([])

    def _block(self, request: DraftRequest) -> DraftBlock:
        """The request's block with its context, checked: the held main KV must end just before
        the anchor and cover the W positions before it (or reach position 0)."""
        seq, pos = request.seq_id, request.anchor_pos
        if request.num_drafts < 1:
            raise ValueError(f"sequence {seq}: num_drafts must be at least 1, "
                             f"got {request.num_drafts}")
        if not 0 <= request.anchor_token < self._vocab_size:
            raise ValueError(f"sequence {seq}: anchor token {request.anchor_token} is outside "
                             f"the vocabulary")
        window = self._windows.get(seq)
        held = self.context_positions(seq)
        if pos < 0 or (pos > 0 and (window is None or window.end != pos
                                    or window.start > max(0, pos - self.window_size))):
            holds = f"{held.start}..{held.stop - 1}" if held else "none"
            raise ValueError(f"sequence {seq}: drafting at position {pos} needs the observed "
                             f"positions {max(0, pos - self.window_size)}..{pos - 1}, "
                             f"held: {holds}")
        context = (window.kv if window is not None and pos > 0
                   else self._net.empty_context())
        return DraftBlock(request.anchor_token, pos, request.num_drafts, context)

    def release(self, seq_id: int) -> None:
        """Drop the sequence's draft state (a no-op for an unknown sequence)."""
        self._windows.pop(seq_id, None)
