"""Chained MTP tuning: the demo target's MTP block trained for speculation K tokens deep.

The target's training teaches the MTP block one guess: from the target's streams at p and the id
at p+1, the id at p+2. `{"method":"mtp"}` speculation chains it (MtpDrafter): its second proposal
reads the block's own output streams, its third the second's, and so on to K. Trained on the
target's streams only, its acceptance falls with depth (run N at K = 7, auto tool choice:
97 82 72 66 47 39 31 % per position).

`MtpTuner` trains the block alone, the target frozen, on chains of every depth at once
(`adapter.run_mtp_chain`), against the target's greedy token at every position — speculation
accepts a proposal that equals the target's token. The stream is the target's own fresh-phase
stream far past its training (as the DSpark draft's, draft.py), its first scene of each step
(calls, answers and chat), chains starting at every completion position. Quantization-aware as
the target was. The export is the target's compact checkpoint with only the `mtp.` tensors
replaced; `training.json` lists the block's tunings (`mtp_tuned`, oldest first) beside the
target's own settings.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from services.demo import adapter, export
from services.demo.draft import STREAM_FROM, target_trainer
from services.demo.params import stored_tensors
from services.demo.schedule import warmup_cosine
from services.demo.state_file import read_state, write_state
from services.demo.warm_start import copy_dequantized
from services.worker.model.transformer import DeepseekV4

STATE_FILE = "mtp_state.pt"
MTP_PREFIX = "mtp."


@dataclass(frozen=True)
class MtpTuneSettings:
    seed: int = 1
    steps: int = 150
    learning_rate: float = 3e-4
    warmup_steps: int = 10
    depth: int = 7                     # chain depth trained: the K it is meant to draft for
    stream_from: int = STREAM_FROM + 10_000   # past the indices the DSpark drafts learnt from


class MtpTuner:
    """Resumable: the MTP block's weights, optimizer and history live in `OUT_DIR/mtp_state.pt`."""

    def __init__(self, out_dir: Path, settings: MtpTuneSettings, target_dir: Path,
                 warm_block: Optional[Path] = None):
        """`warm_block`: a compact checkpoint whose MTP block to start from (one tuned on an
        earlier target) instead of the target's own."""
        self.out_dir = out_dir
        self.settings = settings
        self.target_dir = target_dir
        self.warm_block = warm_block
        self.target = target_trainer(out_dir / "target", target_dir)
        params = self.target.params
        params.requires_grad_(False)
        self.names = [name for name in params.names if name.startswith(MTP_PREFIX)]
        self.tuned = [p for name, p in zip(params.names, params.body) if name in self.names]
        if warm_block is not None:
            stored = load_file(str(warm_block / "body.safetensors"))
            with torch.no_grad():
                copy_dequantized(dict(zip(self.names, self.tuned)), stored, self.target.specs)
        for p in self.tuned:
            p.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.tuned, lr=settings.learning_rate,
                                           betas=(0.9, 0.95), weight_decay=0.0)
        self.step_index = 0
        self.history: list[dict] = []
        self._load()

    def train_step(self) -> dict:
        index = self.step_index
        lr = warmup_cosine(index, self.settings.steps, self.settings.warmup_steps,
                           self.settings.learning_rate)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        scores = self.scores(self.target.model(), self.settings.stream_from + index)
        self.optimizer.zero_grad(set_to_none=True)
        scores["loss"].backward()
        norm = torch.nn.utils.clip_grad_norm_(self.tuned, 1.0)
        self.optimizer.step()
        record = {"step": index + 1, "loss": scores["loss"].item(), "lr": lr,
                  "grad_norm": float(norm), **scores["accepted"]}
        self.history.append(record)
        self.step_index += 1
        return record

    def scores(self, model: DeepseekV4, stream_index: int) -> dict:
        """The mean over depths of the chain's cross-entropy against the target's greedy tokens,
        and per depth the share of chains the target would accept up to it."""
        rows = self.target.vocab.rows()
        scene = self.target.training_scenes(stream_index)[0]  # calls and chat, no drills
        ids = [rows.index(e.prompt_ids + e.completion_ids).tolist() for e in scene.examples]
        chain = adapter.run_mtp_chain(model, rows.index(scene.prefix_ids).tolist(), ids,
                                      [len(e.prompt_ids) - 1 for e in scene.examples],
                                      self.settings.depth)
        with torch.no_grad():
            greedy = [model.logits(hidden).argmax(dim=-1) for hidden in chain.hidden]
        losses, right = [], []
        for first, streams in zip(chain.first, chain.streams):
            # The proposal at position p is checked against the target's token at p+2: its
            # greedy choice after position p+1.
            labels = [greedy[k][a + 1 - chain.start_pos:][:len(s)] for k, (a, s)
                      in enumerate(zip(first, streams))]
            logits = model.logits(torch.cat(streams), prefix="mtp.0.")
            losses.append(F.cross_entropy(logits, torch.cat(labels)))
            hits = logits.argmax(dim=-1) == torch.cat(labels)
            right.append(list(hits.split([len(s) for s in streams])))
        return {"loss": torch.stack(losses).mean(), "accepted": chain_acceptance(right)}

    def export(self, out_dir: Path) -> Path:
        """The target's compact checkpoint with this block's `mtp.` tensors, in `out_dir`."""
        compact = out_dir / export.COMPACT_DIR.name
        compact.mkdir(parents=True, exist_ok=True)
        for name in (*export.COMPACT_FILES, export.TRAINING_FILE):
            shutil.copyfile(self.target_dir / name, compact / name)
        body = load_file(str(compact / "body.safetensors"))
        stored = stored_tensors(self.target.params, self.target.vocab, self.target.specs, True)
        tuned = {name: t for name, t in stored.items() if name.startswith(MTP_PREFIX)}
        if not set(tuned) <= set(body):
            raise AssertionError("the tuned block holds tensors the target does not")
        save_file({**body, **tuned}, str(compact / "body.safetensors"), metadata={"format": "pt"})
        record = json.loads((compact / export.TRAINING_FILE).read_text(encoding="utf-8"))
        record["mtp_tuned"] = tunings(self.warm_block or self.target_dir) + [
            {"steps": self.step_index, "settings": asdict(self.settings)}]
        (compact / export.TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n",
                                                    encoding="utf-8")
        return compact

    def save(self) -> None:
        state = {"tuned": {name: p.detach() for name, p in zip(self.names, self.tuned)},
                 "optimizer": self.optimizer.state_dict(), "step": self.step_index,
                 "history": self.history, "settings": asdict(self.settings)}
        write_state(self.out_dir / STATE_FILE, state)

    def _load(self) -> None:
        saved = read_state(self.out_dir / STATE_FILE, asdict(self.settings))
        if saved is None:
            return
        with torch.no_grad():
            for name, p in zip(self.names, self.tuned):
                p.copy_(saved["tuned"][name])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.step_index, self.history = saved["step"], saved["history"]


def tunings(compact_dir: Path) -> list[dict]:
    """The tunings a compact checkpoint's MTP block went through, oldest first."""
    record = json.loads((compact_dir / export.TRAINING_FILE).read_text(encoding="utf-8"))
    return record.get("mtp_tuned", [])


def chain_acceptance(right: list[list[torch.Tensor]]) -> dict[str, float]:
    """right[d][k][i]: depth d's proposal in the i-th chain of sequence k is the target's token
    (row i of every depth belongs to the same chain). Per depth: the share of the chains reaching
    it whose proposals up to it are all right — what greedy verification accepts."""
    accepted = {}
    for d in range(len(right)):
        hits = reach = 0
        for k in range(len(right[d])):
            n = right[d][k].numel()
            hits += int(torch.stack([right[j][k][:n] for j in range(d + 1)]).all(dim=0).sum())
            reach += n
        if reach:
            accepted[f"accepted_{d + 1}"] = hits / reach
    return accepted
