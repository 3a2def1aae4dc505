"""Training state and one optimisation step (resumable: everything lives in `train_state.pt`).

The data stream is a pure function of (seed, step): `DialogGenerator.training_scenes(step)`.
The trained vocabulary is scanned from exactly the scenes the run will learn from. Resuming from a saved state continues the exact same
stream and schedule.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from services.demo import adapter
from services.demo.architecture import DEMO_LAYERS, demo_config
from services.demo.composed import Composer
from services.demo.dialogs import DialogGenerator
from services.demo.encode import EncodedScene, SceneEncoder
from services.demo.evaluate import heldout_scenes
from services.demo.heldout_values import HeldOutValues
from services.demo.objective import SceneScores, scene_targets, score_scene
from services.demo.params import DemoParameters, hash_routing_table, model_tensors
from services.demo.random_drills import RandomDrills
from services.demo.schedule import FIRST, FRESH, INDUCTION, SPAN, TrainSettings, continues
from services.demo.state_file import write_state
from services.demo.unknown_words import UnknownWords
from services.demo.vocab import (VALUE_LEADS, RowMap, TrainedVocab, composed_vocabulary,
                                 listed_name_vocabulary, scan_training, tie_structure,
                                 unspaced_s_vocabulary)
from services.demo.warm_start import grown_names, load_compact
from services.worker.model.checkpoint import expected_tensors
from services.worker.model.transformer import DeepseekV4
from services.worker.model.weights import ModelWeights

STATE_FILE = "train_state.pt"
DELTA_WEIGHT_DECAY = 0.1
HELDOUT_GUARD = 200   # held-out prompts whose values the copy phase never trains on (≥ the bench's)


@dataclass(frozen=True)
class WarmStart:
    """Start a run from a compact checkpoint (warm_start.py) as if `step` steps had run: the
    stream and schedule go on from there, with a fresh optimizer."""

    compact_dir: Path
    step: int


class Trainer:
    def __init__(self, out_dir: Path, settings: TrainSettings,
                 warm_start: Optional[WarmStart] = None):
        """Resumes `out_dir`'s saved state if there is one; otherwise starts from `warm_start`
        if given, else from step 0 with seeded weights."""
        self.out_dir = out_dir
        self.settings = settings
        self.config = demo_config(settings.layers)
        self.specs = expected_tensors(self.config)
        self.encoder = SceneEncoder(no_lone_s=settings.fresh_no_lone_s)
        self.generator = DialogGenerator(settings.seed, held_out=False)
        saved = self._load()
        ids, self.training_values = ((saved["vocab_ids"], saved["training_values"]) if saved else
                                     scan_training(settings.seed, settings.steps,
                                                   settings.examples_per_scene))
        if settings.fresh_composed and not saved:
            ids = sorted({*ids, *composed_vocabulary(self.encoder,
                                                     wide=settings.fresh_composed_wide)})
        if (settings.fresh_listed_names or settings.fresh_listed_drills) and not saved:
            ids = sorted({*ids, *listed_name_vocabulary(self.encoder)})
        if settings.fresh_no_lone_s and not saved:
            ids = sorted({*ids, *unspaced_s_vocabulary(self.encoder)})
        self.vocab: TrainedVocab = tie_structure(list(ids), self.encoder)
        self.hash_table = (saved["hash_table"] if saved
                           else hash_routing_table(self.config, settings.seed))
        self.params = DemoParameters(self.config, self.vocab, settings.seed,
                                     spelt=settings.spelt_embeddings)
        self.optimizer = torch.optim.AdamW(self._groups(), lr=settings.learning_rate,
                                           betas=(0.9, 0.95))
        self.step_index = 0
        self.history: list[dict] = []
        # The runs whose weights this state averages (average_cli.py), each {"run", "step",
        # "settings"}; empty for a trained state.
        self.averaged_from: list[dict] = []
        self._heldout_values: Optional[HeldOutValues] = None
        self.random_drills = RandomDrills(self.vocab, self.encoder, settings.seed)
        self.fresh_generator = DialogGenerator(settings.seed, held_out=False, fresh=True,
                                               accepts=self._spelled_by_vocab,
                                               frames=settings.fresh_frames,
                                               long_values=settings.fresh_long_values,
                                               composed_share=settings.fresh_composed,
                                               composer=self._composer(),
                                               path_parts=settings.fresh_path_parts,
                                               listed_names=settings.fresh_listed_names,
                                               short_options=settings.fresh_short_options,
                                               slash_ends=settings.fresh_slash_ends,
                                               letter_starts=settings.fresh_letter_starts,
                                               s_starts=settings.fresh_s_starts)
        self.unknown_words = (UnknownWords(self.vocab, self.encoder, settings.seed,
                                           settings.fresh_unknown_words)
                              if settings.fresh_unknown_words else None)
        if saved:
            self.params.load_state_dict(saved["params"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.step_index, self.history = saved["step"], saved["history"]
            self.averaged_from = saved.get("averaged_from", [])
        elif warm_start:
            self.hash_table = load_compact(self.params, self.vocab, self.specs,
                                           warm_start.compact_dir)
            self.step_index = warm_start.step

    def model(self, quantized: bool = True, rows: Optional[RowMap] = None) -> DeepseekV4:
        tensors = model_tensors(self.params, self.vocab, self.specs, self.hash_table, quantized,
                                rows or self.vocab.rows())
        return DeepseekV4(self.config, ModelWeights(tensors, torch.float32, "cpu"))

    def train_step(self) -> dict:
        index = self.step_index
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.learning_rate_at(index) * group.get("lr_scale", 1.0)
        scenes = self.training_scenes(index)
        if self.unknown_words and self.settings.phase(index) == FRESH:
            scenes = self.unknown_words.scenes(scenes, index)
        rows = self.vocab.rows(self.vocab.outside(
            [t for scene in scenes for e in scene.examples for t in e.prompt_ids]))
        model = self.model(rows=rows)
        key_weight = self.settings.key_weight if self.settings.phase(index) != FIRST else None
        scores = [self.score(model, rows, scene, with_mtp=True, key_weight=key_weight)
                  for scene in scenes]
        weights = [s.num_targets for s in scores]
        loss = sum(s.loss * w for s, w in zip(scores, weights)) / sum(weights)
        mtp_loss = sum(s.mtp_loss * w for s, w in zip(scores, weights)) / sum(weights)
        self.optimizer.zero_grad(set_to_none=True)
        (loss + self.settings.mtp_weight * mtp_loss).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params.parameters(), self.settings.clip_norm)
        self.optimizer.step()
        record = {"step": index + 1, "loss": loss.item(), "mtp_loss": mtp_loss.item(),
                  "token_accuracy": _weighted(scores, "token_accuracy"),
                  "mtp_accuracy": _weighted(scores, "mtp_accuracy"),
                  "grad_norm": float(norm), "lr": self.settings.learning_rate_at(index)}
        self.history.append(record)
        self.step_index += 1
        return record

    def training_scenes(self, index: int) -> list[EncodedScene]:
        """The step's scenes, each without the examples that hold an untrained token."""
        phase = self.settings.phase(index)
        scenes = ([self.random_drills.scene(index, self.settings.random_drills)]
                  if phase == INDUCTION else [])
        if phase == SPAN:
            scenes += [self.random_drills.call_scene(index, self.settings.span_calls, shared=True),
                       self.random_drills.scene(index, self.settings.span_drills, repeats=True)]
        if self.settings.random_calls_at(index):
            scenes.append(self.random_drills.call_scene(index, self.settings.random_calls_at(index)))
        if phase == FRESH:
            scenes += [*self.fresh_generator.training_scenes(
                index, self.settings.fresh_examples, self.settings.long_drills),
                self.random_drills.scene(index, self.settings.fresh_random_drills,
                                         slash_share=self.settings.fresh_slash_pieces)]
            if self.settings.fresh_respelt_calls:
                scenes.append(self.random_drills.call_scene(
                    index, self.settings.fresh_respelt_calls, respelt=True))
            if self.settings.fresh_listed_drills:
                scenes.append(self.fresh_generator.listed_drill_scene(
                    index, self.settings.fresh_listed_drills))
        elif phase != INDUCTION or self.settings.mixes_stream(index):
            scenes += self.generator.training_scenes(
                index, self.settings.examples_per_scene,
                0 if phase == FIRST else self.settings.long_drills)
        kept_scenes = []
        for scene in scenes:
            encoded = self.encoder.scene(scene)
            kept = [e for e in encoded.examples
                    if self.vocab.covers(e.prompt_ids) and self.vocab.covers(e.completion_ids)
                    and not (phase != FIRST and self._holds_heldout_value(e.example.copy_values))]
            if kept:
                kept_scenes.append(EncodedScene(encoded.prefix_ids, kept, scene))
        if not kept_scenes:
            raise RuntimeError(f"training step {index} has no example inside the vocabulary")
        return kept_scenes

    def _spelled_by_vocab(self, value: str) -> bool:
        """Whether the trained vocabulary has every token of `value` after a space and as a call
        writes it; without `fresh_call_spelling`, after a space and in canonical BPE after a
        quote (see TrainSettings). A request that quotes the value may still hold a token
        without a row (`"N`): that example is left out of its step (`training_scenes`)."""
        if not self.settings.fresh_call_spelling:
            return all(self.vocab.covers(self.encoder.encode(lead + value))
                       for lead in VALUE_LEADS)
        return (self.vocab.covers(self.encoder.encode(" " + value))
                and self.vocab.covers(self.encoder.call_spelling(value)))

    def _holds_heldout_value(self, copied: list[str]) -> bool:
        """Whether a copy-phase value holds a held-out value: its stream is not part of the
        vocabulary scan (`training_values`), so it is kept apart from the held-out set here."""
        if self._heldout_values is None:
            scenes = heldout_scenes(self.vocab, self.encoder, HELDOUT_GUARD, self.training_values)
            self._heldout_values = HeldOutValues(
                {v for s in scenes for v in s.examples[0].example.novel_values},
                self.settings.fresh_word_values)
        return self._heldout_values.refuses(copied)

    def score(self, model: DeepseekV4, rows: RowMap, scene: EncodedScene, with_mtp: bool,
              key_weight: Optional[float] = None) -> SceneScores:
        """Scores of the scene's examples on a model with `rows` (every token must have one);
        with `key_weight`, key tokens weigh that much in the loss."""
        examples = scene.examples
        sequences = [rows.index(e.prompt_ids + e.completion_ids) for e in examples]
        prefix = rows.index(scene.prefix_ids).tolist()
        hidden = adapter.run_scene(model, prefix, [s.tolist() for s in sequences], with_mtp)
        keys = None if key_weight is None else [e.key_tokens for e in examples]
        targets = scene_targets(sequences, [len(e.prompt_ids) for e in examples], hidden.start_pos,
                                keys, key_weight or 1.0)
        return score_scene(model, hidden, targets)

    def save(self) -> None:
        state = {"params": self.params.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": self.step_index, "history": self.history,
                 "vocab_ids": self.vocab.ids.tolist(), "training_values": self.training_values,
                 "hash_table": self.hash_table,
                 "settings": asdict(self.settings), "averaged_from": self.averaged_from}
        write_state(self.out_dir / STATE_FILE, state)

    def _composer(self) -> Optional[Composer]:
        """The fresh phase's composer; none when no request is composed (no guard built)."""
        settings = self.settings
        if not settings.fresh_composed:
            return None
        return Composer(wide=settings.fresh_composed_wide,
                        leading_share=settings.fresh_leading_heads)

    def _load(self) -> Optional[dict]:
        path = self.out_dir / STATE_FILE
        if not path.is_file():
            return None
        saved = torch.load(path, weights_only=False)
        if not continues(saved["settings"], self.settings, saved["step"]):
            raise ValueError(f"{path} was written with other settings: {saved['settings']}")
        return saved

    def _groups(self) -> list[dict]:
        """Vocabulary deltas (decayed), the layers past the first DEMO_LAYERS (at
        `grown_learning_rate_scale` × the rate), and the rest."""
        deltas = [self.params.embed_delta, self.params.head_delta]
        body = self.params.body_tensors()
        grown = [body[name] for name in sorted(grown_names(body, DEMO_LAYERS))]
        rest = [p for p in self.params.parameters()
                if all(p is not d for d in deltas) and all(p is not g for g in grown)]
        groups = [{"params": rest, "weight_decay": 0.0},
                  {"params": deltas, "weight_decay": DELTA_WEIGHT_DECAY}]
        if grown:
            groups.append({"params": grown, "weight_decay": 0.0,
                           "lr_scale": self.settings.grown_learning_rate_scale})
        return groups


def _weighted(scores: list[SceneScores], key: str) -> float:
    total = sum(s.num_targets for s in scores)
    return sum(getattr(s, key) * s.num_targets for s in scores) / total
