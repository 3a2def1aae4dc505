"""The trained vocabulary: the token ids the training data uses, and how their rows are tied.

Only these rows of `embed` and `head` are trained (the others are never seen). A token spelled with
a leading space (`Ġword`) shares a base vector with the same token without the space (`word`):
copying a value from "in Paris" to `">Paris` is then one generic operation (drop the space
direction) instead of one learned pair per word. The head shares the same base vectors (tied
embeddings), so moving a token's vector to the output predicts that token.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from services.demo.composed import Composer
from services.demo.dialogs import FRAMED_SHARE, DialogGenerator
from services.demo.encode import SPACE, SceneEncoder
from services.demo.fresh_values import LISTED_NAME_KINDS, s_start_words
from services.demo.lists import pool
from services.demo.tools import CATALOG

FILLER = "Paris"          # a value word the first phase trains: stands for every value
COMPOSED_SAMPLES = 4000
# What comes before a value in a request ("in Madrid") and in a call (a quote): a value is
# spelled with the vocabulary if it is after both.
VALUE_LEADS = (" ", "\"")

@dataclass(frozen=True)
class TrainedVocab:
    ids: torch.Tensor          # int64 [Vt], ascending full-vocabulary ids
    base: torch.Tensor         # int64 [Vt]: index of the row's base vector
    spaced: torch.Tensor       # float32 [Vt]: 1 for a token with a leading space whose bare form exists
    num_bases: int

    def __len__(self) -> int:
        return int(self.ids.numel())

    def rows(self, untrained: list[int] = ()) -> "RowMap":
        """The model's rows: the trained ids, then `untrained` ids (rows as export.py gives them:
        a stand-in's `embed` row or the mean, the mean `head` row)."""
        return RowMap(self.ids.tolist() + list(untrained), len(self))

    def covers(self, token_ids: list[int]) -> bool:
        return set(token_ids) <= self._members()

    def outside(self, token_ids: list[int]) -> list[int]:
        """The distinct ids of `token_ids` without a trained row, ascending."""
        return sorted(set(token_ids) - self._members())

    def _members(self) -> frozenset[int]:
        return frozenset(self.ids.tolist())


@dataclass(frozen=True)
class RowMap:
    """Full-vocabulary ids of a compact model's embedding/head rows, in row order."""

    ids: list[int]
    num_trained: int

    def index(self, token_ids: list[int]) -> torch.Tensor:
        row_of = {token_id: row for row, token_id in enumerate(self.ids)}
        return torch.tensor([row_of[t] for t in token_ids], dtype=torch.int64)

    @property
    def untrained(self) -> list[int]:
        return self.ids[self.num_trained:]


def tie_structure(ids: list[int], encoder: SceneEncoder) -> TrainedVocab:
    """Base index and space flag of every trained id (bases keyed by the bare token)."""
    bases: dict[int, int] = {}
    base_of: list[int] = []
    spaced: list[float] = []
    for token_id in ids:
        text = encoder.tokenizer.id_to_token(token_id)
        bare = encoder.tokenizer.token_to_id(text[1:]) if text.startswith(SPACE) else None
        key = bare if bare is not None else token_id
        base_of.append(bases.setdefault(key, len(bases)))
        spaced.append(1.0 if bare is not None else 0.0)
    return TrainedVocab(torch.tensor(ids, dtype=torch.int64), torch.tensor(base_of),
                        torch.tensor(spaced), len(bases))


def scan_training(seed: int, scenes: int, examples: int) -> tuple[list[int], list[str]]:
    """Every token id and every copied value (argument strings, tool results) of the training
    stream's scenes 0..scenes-1 — exactly the data a run of `scenes` steps learns from."""
    encoder = SceneEncoder()
    generator = DialogGenerator(seed, held_out=False)
    found: set[int] = set()
    copied: set[str] = set()
    for index in range(scenes):
        for scene in generator.training_scenes(index, examples):
            for item in encoder.scene(scene).examples:
                found.update(item.prompt_ids)
                found.update(item.completion_ids)
                copied.update(item.example.copy_values)
    return sorted(found), sorted(copied)


def composed_vocabulary(encoder: SceneEncoder, samples: int = COMPOSED_SAMPLES,
                        wide: bool = False) -> list[int]:
    """Token ids of composed request templates (composed.py), half of them in conversational
    frames (phrasing.py), with every value spelled FILLER: what a run with composed templates
    adds to the scan. The first phase's stream holds none of the frames' first words ("Could",
    "Would", "Kindly" …), so without these rows a framed request was skipped as untrained.
    With `wide`, also those of the wider parts (composed_wide.py) and of every enum and boolean
    phrase they may use, each said inside a sentence."""
    found = _template_ids(encoder, Composer(), samples)
    if wide:
        composer = Composer(wide=True)
        found |= _template_ids(encoder, composer, samples)
        for spec in CATALOG:
            for by_value in composer.value_phrases(spec).values():
                for phrase in (p for phrases in by_value.values() for p in phrases):
                    found.update(encoder.encode(f"Do it {phrase}."))
    return sorted(found)


def listed_name_vocabulary(encoder: SceneEncoder) -> list[int]:
    """Token ids of the training lists' cities, first names and surnames after a space and after
    a quote (how requests and calls spell them): what a run with listed names adds to the scan.
    The first phase's stream holds only some of them (55 of 159 cities lacked a row, Oslo among
    them), and a value with an untrained token is redrawn, so without these rows those names
    would never be drawn."""
    return sorted({token for kind in LISTED_NAME_KINDS for name in pool(kind, False)
                   for lead in VALUE_LEADS for token in encoder.encode(lead + name)})


def unspaced_s_vocabulary(encoder: SceneEncoder) -> list[int]:
    """Token ids of the letter starts' s-words as a call spells them with `no_lone_s` (`so`+`up`):
    what a run with it adds to the scan (`so`, `sp`, `rint`, `cc` and `iling` had no row)."""
    return sorted({token for word in s_start_words() for token in encoder.unspaced_value(word)})


def _template_ids(encoder: SceneEncoder, composer: Composer, samples: int) -> set[int]:
    rng = random.Random(f"composed-vocabulary:{samples}")
    found: set[int] = set()
    for _ in range(samples):
        spec = rng.choice(CATALOG)
        template = composer.template(spec, rng, [p.name for p in spec.params], FRAMED_SHARE)
        if template is not None:
            found.update(encoder.encode(template.format(**{p.name: FILLER for p in spec.params})))
    return found
