"""The training recipe: its settings, which phase a step is in, its learning rate, and whether a
saved state may continue under other settings."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from services.demo.architecture import DEMO_LAYERS

FIRST, COPY, INDUCTION, SPAN, FRESH = "first", "copy", "induction", "span", "fresh"
# Settings a state saved by an older trainer lacks, with the values it ran under.
LEGACY_SETTINGS = {"copy_cosine_steps": 0, "induction_steps": 0, "random_calls": 0, "span_steps": 0,
                   "fresh_steps": 0, "fresh_long_values": False,
                   "fresh_composed": 0.0, "fresh_composed_wide": False,
                   "fresh_path_parts": False, "fresh_unknown_words": 0.0,
                   "fresh_word_values": False, "fresh_leading_heads": 0.0,
                   "fresh_listed_names": 0.0, "fresh_listed_drills": 0,
                   "fresh_short_options": False, "fresh_slash_pieces": 0.0,
                   "fresh_slash_ends": False, "fresh_letter_starts": False,
                   "fresh_respelt_calls": 0, "spelt_embeddings": False,
                   "fresh_no_lone_s": False, "fresh_s_starts": 0.0,
                   "fresh_call_spelling": False,
                   "layers": DEMO_LAYERS, "grown_learning_rate_scale": 1.0}


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 1
    # The model's layers (architecture.demo_config); a warm start from fewer grows it.
    layers: int = DEMO_LAYERS
    # The layers past the first DEMO_LAYERS learn at this multiple of the learning rate: grown
    # from a checkpoint, they start near the identity and have all to learn.
    grown_learning_rate_scale: float = 1.0
    steps: int = 400
    examples_per_scene: int = 12
    learning_rate: float = 2e-3
    warmup_steps: int = 60
    mtp_weight: float = 0.3
    clip_norm: float = 1.0
    # The copy phase: `copy_steps` more steps after `steps` (the vocabulary stays the one of the
    # first `steps`), each with `long_drills` drills of values no list holds; key tokens (copied
    # values, the tool's name, the token closing a value) weigh `key_weight` in the loss; its own
    # warm-up and cosine from `copy_learning_rate`, over `copy_cosine_steps` (0: `copy_steps`;
    # longer to cut a planned phase short and continue with the next on the same schedule).
    copy_steps: int = 600
    long_drills: int = 24
    key_weight: float = 3.0
    copy_learning_rate: float = 1e-3
    copy_warmup_steps: int = 20
    copy_cosine_steps: int = 0
    # The induction phase after it: every step `random_drills` drills of random token strings
    # (random_drills.py); from its `induction_solo_steps`-th step on, every `mix_every`-th step
    # also learns the copy phase's stream (tool choice and the call format stay learnt). Its own
    # warm-up and cosine from `induction_learning_rate`. Off by default: the one run that tried it
    # (docs/demo-model.md) copied random strings but not held-out arguments.
    induction_steps: int = 0
    random_drills: int = 48
    induction_solo_steps: int = 50
    mix_every: int = 2
    induction_learning_rate: float = 2e-3
    induction_warmup_steps: int = 10
    # From step `random_calls_from` on (absolute), every induction step also learns a scene of
    # `random_calls` tool calls whose free-text arguments are random strings
    # (random_drills.RandomDrills.call_scene).
    random_calls: int = 12
    random_calls_from: int = 900
    # The span phase after those (usually from a warm start, warm_start.py): every step learns
    # the copy phase's stream, `span_calls` tool calls whose free-text values are random strings
    # sharing tokens (span_drills.py), and `span_drills` random-string drills with repeated
    # tokens, so that a copy must find where a value starts and ends, not only what it holds.
    # Its own warm-up and cosine from `span_learning_rate`.
    span_steps: int = 0
    span_calls: int = 12
    span_drills: int = 16
    span_learning_rate: float = 1e-3
    span_warmup_steps: int = 20
    # The fresh phase after those (usually from a warm start): the copy phase's stream with
    # every value drawn anew (fresh_values.py), so that no value can be recalled, with
    # `fresh_examples` examples per scene, and `fresh_random_drills` random-string drills; with
    # `fresh_frames`, requests in conversational frames too (phrasing.py). Its own warm-up and
    # cosine from `fresh_learning_rate`.
    fresh_steps: int = 0
    fresh_examples: int = 24
    fresh_random_drills: int = 16
    fresh_frames: bool = False
    # With `fresh_long_values`, free-text values of more words (fresh_values.LONG_MAKERS).
    fresh_long_values: bool = False
    # `fresh_composed` of the fresh phase's call requests use a composed template (composed.py),
    # and the vocabulary gains the composed templates' and frames' words (a warm start adds
    # their rows: warm_start.py).
    fresh_composed: float = 0.0
    # With `fresh_composed_wide`, composed templates draw from the wider parts too
    # (composed_wide.py), whose words also join the vocabulary.
    fresh_composed_wide: bool = False
    # `fresh_leading_heads` of a composed template's heads say an optional parameter, where the
    # tool has such heads (composed.Composer).
    fresh_leading_heads: float = 0.0
    # With `fresh_path_parts`, paths are built from the training lists' directory names and file
    # stems too (fresh_values.with_path_parts).
    fresh_path_parts: bool = False
    # That share of the city and person names are the training lists' real ones, not invented
    # (fresh_values.with_listed_names).
    fresh_listed_names: float = 0.0
    # Drills of those names per step ("Repeat after me: Madrid"; dialogs.listed_drill_scene).
    fresh_listed_drills: int = 0
    # With `fresh_short_options`, a share of commands are a listed name with short options
    # ("df -k"; fresh_values.with_short_options).
    fresh_short_options: bool = False
    # That share of a fresh random drill's tokens after the first are slash-merged path pieces
    # ("/data"; random_drills.RandomDrills.scene).
    fresh_slash_pieces: float = 0.0
    # With `fresh_slash_ends`, a share of directories and paths end with a slash-merged piece
    # ("/srv/log/config"; fresh_values.with_slash_ends).
    fresh_slash_ends: bool = False
    # With `fresh_letter_starts`, a share of free-text values start with a word spelt from a
    # one-letter piece ("soup" as `s`+`oup`; fresh_values.with_letter_starts).
    fresh_letter_starts: bool = False
    # With `fresh_no_lone_s`, a copied value whose spelling after `">` starts with the piece `s`
    # starts with a piece of 2+ letters instead ("soup" as `so`+`up`; encode.SceneEncoder).
    # Run R2 (120 steps from run I2 at peak 1e-4) still wrote every s-word start wrong: without
    # `fresh_call_spelling` its stream kept no s-word start (347 of 400 calls right against 346).
    fresh_no_lone_s: bool = False
    # With `fresh_letter_starts`, that share of the letter-start words are the four spelt from
    # `s` (evenly drawn: ~30 soup starts in 120 steps). Without `fresh_call_spelling` every one
    # was redrawn: run S1 (0.5) wrote them as wrong as run R2 (346 of 400).
    fresh_s_starts: float = 0.0
    # With `fresh_call_spelling`, a fresh value is kept when the trained vocabulary spells it as a
    # request does (after a space) and as a call writes it (encode.SceneEncoder.call_spelling).
    # Without it, also as canonical BPE after a quote, which merges `"` with some first
    # characters (`/`, the s of soup, sprint, soccer, sailing, an N or M before some letters …)
    # into tokens without a row: every such value was redrawn, so the fresh phases before run R5
    # all but never trained absolute paths and never an s-word start.
    fresh_call_spelling: bool = False
    # That many tool calls per step whose free-text values are random strings starting with a
    # spaced token a call respells (` Nir` as `N`+`ir`; random_drills.RandomDrills.call_scene).
    # Run M (16 per step for 120 steps from run I2) wrote 272 of 400 calls right against 346:
    # its calls double what they copy (`paint paint`), and the respelt starts stay wrong.
    fresh_respelt_calls: int = 0
    # With `spelt_embeddings`, a spaced word token whose bare spelling is two trained pieces reads
    # with a trace of theirs in its `embed` row (standins.py): ` Kore` carries `K` and `ore`.
    # Runs P1 and Q1 (with 8 respelt calls per step for 120 steps from run I2) wrote 290 and 284
    # of 400 calls right against 346: the first piece of a respelt start, never the second.
    # Run R1 (traces, no respelt calls) wrote 339: its calls double words as well.
    spelt_embeddings: bool = False
    # That share of the call examples gets 1–2 words outside the trained vocabulary in its
    # request (unknown_words.py).
    fresh_unknown_words: float = 0.0
    # With `fresh_word_values`, a held-out value that is one word of the shared pool keeps only
    # that whole value out of training, not the word (heldout_values.py).
    fresh_word_values: bool = False
    fresh_learning_rate: float = 1e-3
    fresh_warmup_steps: int = 20

    @property
    def total_steps(self) -> int:
        return self._fresh_from + self.fresh_steps

    @property
    def _fresh_from(self) -> int:
        return self.steps + self.copy_steps + self.induction_steps + self.span_steps

    def phase(self, index: int) -> str:
        if index < self.steps:
            return FIRST
        if index < self.steps + self.copy_steps:
            return COPY
        if index < self.steps + self.copy_steps + self.induction_steps:
            return INDUCTION
        return SPAN if index < self._fresh_from else FRESH

    def mixes_stream(self, index: int) -> bool:
        """Whether an induction-phase step also learns the copy phase's stream."""
        offset = index - self.steps - self.copy_steps
        return offset >= self.induction_solo_steps and offset % self.mix_every == 0

    def random_calls_at(self, index: int) -> int:
        """Random-string tool calls step `index` learns (induction phase only)."""
        active = self.phase(index) == INDUCTION and index >= self.random_calls_from
        return self.random_calls if active else 0

    def learning_rate_at(self, index: int) -> float:
        phase = self.phase(index)
        if phase == FIRST:
            return warmup_cosine(index, self.steps, self.warmup_steps, self.learning_rate)
        if phase == COPY:
            return warmup_cosine(index - self.steps, self.copy_cosine_steps or self.copy_steps,
                                 self.copy_warmup_steps, self.copy_learning_rate)
        if phase == INDUCTION:
            return warmup_cosine(index - self.steps - self.copy_steps, self.induction_steps,
                                 self.induction_warmup_steps, self.induction_learning_rate)
        if phase == SPAN:
            return warmup_cosine(index - self.steps - self.copy_steps - self.induction_steps,
                                 self.span_steps, self.span_warmup_steps, self.span_learning_rate)
        return warmup_cosine(index - self._fresh_from, self.fresh_steps, self.fresh_warmup_steps,
                             self.fresh_learning_rate)


def saved_settings(saved: dict) -> TrainSettings:
    """The settings a state or `training.json` recorded (older ones lack the newer fields)."""
    return TrainSettings(**{**LEGACY_SETTINGS, **saved})


def continues(saved: dict, current: TrainSettings, steps_done: int) -> bool:
    """Whether a state saved after `steps_done` steps under `saved` settings may continue under
    `current`: every step it ran is the same step (phase, data, learning rate) under both. Fields
    the older state lacks and that it never used take the current values."""
    before = TrainSettings(**{**asdict(current), **LEGACY_SETTINGS, **saved})
    data = ("seed", "layers", "grown_learning_rate_scale", "steps", "examples_per_scene",
            "mtp_weight", "clip_norm", "spelt_embeddings")
    by_phase = {COPY: ("long_drills", "key_weight"),
                INDUCTION: ("long_drills", "key_weight", "random_drills"),
                SPAN: ("long_drills", "key_weight", "span_calls", "span_drills"),
                FRESH: ("long_drills", "key_weight", "fresh_examples", "fresh_random_drills",
                        "fresh_frames", "fresh_long_values", "fresh_composed",
                        "fresh_composed_wide", "fresh_path_parts", "fresh_unknown_words",
                        "fresh_word_values", "fresh_leading_heads", "fresh_listed_names",
                        "fresh_listed_drills", "fresh_short_options", "fresh_slash_pieces",
                        "fresh_slash_ends", "fresh_letter_starts", "fresh_respelt_calls",
                        "fresh_no_lone_s", "fresh_s_starts", "fresh_call_spelling")}
    used = {before.phase(i) for i in range(steps_done)}
    same = [k for k in data + tuple(k for p in used for k in by_phase.get(p, ()))]
    return (all(getattr(before, k) == getattr(current, k) for k in same)
            and all(before.phase(i) == current.phase(i)
                    and before.learning_rate_at(i) == current.learning_rate_at(i)
                    and before.random_calls_at(i) == current.random_calls_at(i)
                    and (before.phase(i) != INDUCTION
                         or before.mixes_stream(i) == current.mixes_stream(i))
                    for i in range(steps_done)))


def warmup_cosine(index: int, steps: int, warmup_steps: int, peak: float) -> float:
    """Linear warm-up to `peak`, then a cosine down to a tenth of it at `steps`."""
    if index < warmup_steps:
        return peak * (index + 1) / warmup_steps
    progress = (index - warmup_steps) / max(1, steps - warmup_steps)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))
