"""The demo's DSpark draft: one draft stage trained on the committed demo target.

`dsv4serve train-demo-draft OUT_DIR` trains it; `dsv4serve make-demo-checkpoint DIR --dspark`
writes the DSpark variant of the demo (the demo target byte for byte, its MTP block replaced by the
draft stage), which `--speculative-config '{"method":"dspark",…}'` serves.

Shape: `architecture.DRAFT_OVERRIDES`. Export: draft_export.py.

Training (distillation from the frozen target): the stream is the target's own fresh-phase stream
from `STREAM_FROM` on (step indices the target never learnt from; held-out values kept out as the
target's trainer does). Per step the target runs teacher-forced, with its taps, over the step's
first scene (calls, tool-result answers and chat; no drills), and its greedy token at every
position is the label the draft must propose — speculation accepts
a draft token when it equals the target's. Anchors are drawn from the completions (drafting happens
only in decode); each anchor's block attends over the main KV of the `sliding_window` positions
before it, as `DSparkDrafter` holds it. The Markov head gets its predecessors from the labels (the
token a row's predecessor proposes when it is accepted). Loss: cross-entropy of every row, plus
`confidence_weight` × the confidence head's binary cross-entropy against "this row is the target's
token". Quantization-aware as the target was (params.py), the target's tensors fixed.

The stage starts from the trained MTP block (same block, same names under `mtp.0.`), `main_proj`
from the identity: its first drafts are the MTP block's guess of the next token from the last
layer. Or, with a warm start (`load_draft`), from a draft trained on an earlier target: a target
trained further needs its draft distilled again, and the earlier one is most of the way there.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from services.demo import adapter
from services.demo.architecture import DEMO_LAYERS, demo_config_json, draft_config_json
from services.demo.draft_export import MARKOV, write_draft
from services.demo.params import (fake_quantize_grouped, initial_value, logical_shape,
                                 model_tensors)
from services.demo.export import read_training
from services.demo.schedule import warmup_cosine
from services.demo.state_file import read_state, write_state
from services.demo.trainer import Trainer, WarmStart
from services.demo.vocab import RowMap
from services.demo.warm_start import copy_dequantized
from services.worker.model.checkpoint import SCALE_SUFFIX, TensorSpec, expected_tensors
from services.worker.model.config import ModelConfig
from services.worker.model.dspark_draft import DraftBlock, DSparkNetwork
from services.worker.model.transformer import DeepseekV4
from services.worker.model.weights import ModelWeights

STREAM_FROM = 50_000
STATE_FILE = "draft_state.pt"


def target_trainer(out_dir: Path, target_dir: Path) -> Trainer:
    """The target's trainer, its weights from `target_dir`: only the draft's source of scenes
    (its fresh-phase stream from STREAM_FROM on, with the vocabulary the target was trained
    with), so its fresh phase is stretched to reach that far."""
    settings, step = read_training(target_dir)
    return Trainer(out_dir, replace(settings, fresh_steps=2 * STREAM_FROM),
                   WarmStart(target_dir, step))


def draft_config(layers: int = DEMO_LAYERS) -> ModelConfig:
    """The DSpark variant of a demo target of `layers` layers."""
    return ModelConfig.from_dict(draft_config_json(demo_config_json(layers)))


def draft_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """The draft's own tensors (`mtp.` names) of a DSpark config."""
    return {name: spec for name, spec in expected_tensors(config).items()
            if name.startswith("mtp.")}


@dataclass(frozen=True)
class DraftSettings:
    seed: int = 1
    steps: int = 300
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    drafts: int = 7                 # K: rows of a block, tokens proposed
    anchors_per_step: int = 512     # blocks a step learns from, drawn over its completions
    confidence_weight: float = 0.1
    # The stream index of step 1: a warm-started run starts past the steps its draft learnt from.
    stream_from: int = STREAM_FROM


class DraftParameters(torch.nn.Module):
    """float32 masters of the draft's tensors; the Markov head's rows only for trained ids."""

    def __init__(self, specs: dict[str, TensorSpec], trained_rows: int, seed: int):
        super().__init__()
        self.names = [n for n in specs if not n.endswith(SCALE_SUFFIX) and n not in MARKOV]
        self.body = torch.nn.ParameterList(
            [torch.nn.Parameter(initial_value(n, logical_shape(n, specs), seed))
             for n in self.names])
        rank = specs[MARKOV[0]].shape[1]
        # markov_w2 starts at zero: no Markov correction until it is learnt.
        w1, w2 = MARKOV
        self.markov = torch.nn.ParameterList(
            [torch.nn.Parameter(initial_value(w1, (trained_rows, rank), seed)),
             torch.nn.Parameter(torch.zeros(trained_rows, rank))])

    def body_tensors(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.body))


def draft_tensors(params: DraftParameters, specs: dict[str, TensorSpec], rows: RowMap
                  ) -> dict[str, torch.Tensor]:
    """The draft's tensors as the runtime loads them (compact rows, as `model_tensors`)."""
    tensors = fake_quantize_grouped({**params.body_tensors(), **dict(zip(MARKOV, params.markov))},
                                    specs)
    for name in MARKOV:
        mean = tensors[name].mean(dim=0, keepdim=True).expand(len(rows.untrained), -1)
        tensors[name] = torch.cat([tensors[name], mean])
    return tensors


class DraftTrainer:
    """Resumable like the target's trainer: everything lives in `OUT_DIR/draft_state.pt`."""

    def __init__(self, out_dir: Path, settings: DraftSettings, target_dir: Path,
                 warm_draft: Optional[Path] = None, warm_draft_ids: Optional[list[int]] = None):
        """`warm_draft_ids`: the trained ids of the target `warm_draft` was trained on, where
        they are not this target's (its Markov rows are matched by id: `load_draft`)."""
        self.out_dir = out_dir
        self.settings = settings
        self.target = target_trainer(out_dir / "target", target_dir)
        self.config = draft_config(self.target.settings.layers)
        self.specs = draft_specs(self.config)
        noise = self.config.dspark_noise_token_id
        self.rows = self.target.vocab.rows([noise] if noise not in self.target.vocab.ids else [])
        # The model computes over compact rows: its noise token is the noise id's row.
        self.compact_config = replace(self.config,
                                      dspark_noise_token_id=self.rows.index([noise]).item())
        with torch.no_grad():
            target = model_tensors(self.target.params, self.target.vocab, self.target.specs,
                                   self.target.hash_table, True, self.rows)
        self.target_tensors = {n: t for n, t in target.items() if not n.startswith("mtp.")}
        self.params = DraftParameters(self.specs, len(self.target.vocab), settings.seed)
        if warm_draft is None:
            self._start_from_mtp(target)
        else:
            load_draft(self.params, self.specs, warm_draft,
                       None if warm_draft_ids is None
                       else (warm_draft_ids, self.target.vocab.ids.tolist()))
        self.optimizer = torch.optim.AdamW(self.params.parameters(), lr=settings.learning_rate,
                                           betas=(0.9, 0.95), weight_decay=0.0)
        self.step_index = 0
        self.history: list[dict] = []
        self._load()

    def _start_from_mtp(self, target: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, master in self.params.body_tensors().items():
                if name in target and target[name].shape == master.shape:
                    master.copy_(target[name])
            main_proj = self.params.body_tensors()["mtp.0.main_proj.weight"]
            main_proj.copy_(torch.eye(*main_proj.shape))

    def model(self) -> DeepseekV4:
        tensors = {**self.target_tensors, **draft_tensors(self.params, self.specs, self.rows)}
        return DeepseekV4(self.compact_config, ModelWeights(tensors, torch.float32, "cpu"))

    def train_step(self) -> dict:
        index = self.step_index
        lr = warmup_cosine(index, self.settings.steps, self.settings.warmup_steps,
                           self.settings.learning_rate)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        model = self.model()
        scores = self.scores(model, self.settings.stream_from + index)
        loss = scores["loss"] + self.settings.confidence_weight * scores["confidence_loss"]
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params.parameters(), 1.0)
        self.optimizer.step()
        record = {"step": index + 1, "loss": scores["loss"].item(),
                  "confidence_loss": scores["confidence_loss"].item(), "lr": lr,
                  "grad_norm": float(norm), **scores["accepted"]}
        self.history.append(record)
        self.step_index += 1
        return record

    def scores(self, model: DeepseekV4, stream_index: int) -> dict:
        """Losses and per-position acceptance of the draft on one step of the stream."""
        net = DSparkNetwork(model)
        blocks, labels, prev = self._blocks(model, net, stream_index)
        h, rows = net.stage_streams(blocks)
        x = model.collapse(h, net.last)
        logits = model.head_logits(x, net.last) + net.markov_bias(prev)
        loss = F.cross_entropy(logits, labels)
        right = (logits.argmax(dim=-1) == labels)
        confidence = net.confidence(x, prev).clamp(1e-6, 1 - 1e-6)
        confidence_loss = F.binary_cross_entropy(confidence, right.float())
        return {"loss": loss, "confidence_loss": confidence_loss,
                "accepted": _acceptance(right, rows, self.settings.drafts)}

    def _blocks(self, model: DeepseekV4, net: DSparkNetwork, stream_index: int
                ) -> tuple[list[DraftBlock], torch.Tensor, torch.Tensor]:
        """The step's draft blocks (anchors drawn over every completion), the target's greedy
        token for each row, and each row's predecessor."""
        window, k = self.config.sliding_window, self.settings.drafts
        sequences = []
        for scene in self.target.training_scenes(stream_index)[:1]:  # calls and chat, no drills
            ids = [self.rows.index(e.prompt_ids + e.completion_ids).tolist()
                   for e in scene.examples]
            with torch.no_grad():
                tap_layers = net.config.dspark_target_layer_ids
                out = adapter.run_scene(model, self.rows.index(scene.prefix_ids).tolist(), ids,
                                        with_mtp=False, tap_layer_ids=tap_layers)
                greedy = [model.logits(hidden).argmax(dim=-1) for hidden in out.hidden]
            for e, seq, taps, g in zip(scene.examples, ids, out.taps, greedy):
                # greedy[j]: the target's token after position start_pos + j.
                sequences.append((len(e.prompt_ids), seq, taps, g, out.start_pos))
        anchors = [(s, p) for s, (prompt_len, seq, *_) in enumerate(sequences)
                   for p in range(prompt_len, len(seq) - 1)]
        rng = random.Random(f"{self.settings.seed}:draft:{stream_index}")
        chosen = sorted(rng.sample(anchors, min(len(anchors), self.settings.anchors_per_step)))
        blocks, labels, prev, contexts = [], [], [], {}
        for s, p in chosen:
            prompt_len, seq, taps, greedy, start = sequences[s]
            if s not in contexts:
                first = max(0, prompt_len - window)
                positions = torch.arange(first, len(seq) - 1)
                contexts[s] = (first, net.context_kv(taps[first:len(seq) - 1], positions))
            first, kv = contexts[s]
            lo = max(0, p - window)
            n = min(k, len(seq) - 1 - p)
            rows = greedy[p - start:p - start + n]
            blocks.append(DraftBlock(seq[p], p, n, kv[:, lo - first:p - first]))
            labels.append(rows)
            prev.append(torch.cat([torch.tensor([seq[p]]), rows[:-1]]))
        return blocks, torch.cat(labels), torch.cat(prev)

    def export(self, out_dir: Path) -> Path:
        """The draft's compact file (draft_export.py) in `out_dir`."""
        return write_draft(out_dir, self.params.body_tensors(),
                           [rows.detach() for rows in self.params.markov], self.specs)

    def save(self) -> None:
        state = {"params": self.params.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": self.step_index, "history": self.history,
                 "settings": asdict(self.settings)}
        write_state(self.out_dir / STATE_FILE, state)

    def _load(self) -> None:
        saved = read_state(self.out_dir / STATE_FILE, asdict(self.settings))
        if saved is None:
            return
        self.params.load_state_dict(saved["params"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.step_index, self.history = saved["step"], saved["history"]


def load_draft(params: DraftParameters, specs: dict[str, TensorSpec], path: Path,
               ids: Optional[tuple[list[int], list[int]]] = None) -> None:
    """Overwrite `params` in place with a compact draft (`write_draft`'s file): a draft trained
    on an earlier target starts a run on a retrained one. Its Markov rows must be this vocabulary's
    (the same trained ids), unless `ids` gives (the draft's ids, this vocabulary's): rows are then
    matched by id, and an id the draft lacks gets the mean row, as an untrained id has at run
    time (`draft_tensors`)."""
    stored = load_file(str(path))
    if ids is not None:
        stored = {**stored, **{name: _rows_by_id(stored[name].float(), *ids) for name in MARKOV}}
    with torch.no_grad():
        copy_dequantized(params.body_tensors(), stored, specs)
        for name, rows in zip(MARKOV, params.markov):
            if stored[name].shape != rows.shape:
                raise ValueError(f"{path}: {name} has {stored[name].shape[0]} rows, this "
                                 f"vocabulary {rows.shape[0]}")
            rows.copy_(stored[name].float())


def _rows_by_id(rows: torch.Tensor, stored_ids: list[int], ids: list[int]) -> torch.Tensor:
    row_of = {token_id: n for n, token_id in enumerate(stored_ids)}
    mean = rows.mean(dim=0)
    return torch.stack([rows[row_of[t]] if t in row_of else mean for t in ids])


def _acceptance(right: torch.Tensor, rows: list[slice], drafts: int) -> dict[str, float]:
    """Per position k: the share of blocks reaching k whose rows 0..k are all the target's
    tokens — what greedy verification accepts."""
    accepted = {}
    for k in range(drafts):
        reach = [r for r in rows if r.stop - r.start > k]
        if reach:
            accepted[f"accepted_{k + 1}"] = sum(bool(right[r.start:r.start + k + 1].all())
                                                for r in reach) / len(reach)
    return accepted
