"""Held-out evaluation inside the training process (teacher-forced, no services involved).

A held-out example counts as exact when every completion token is the model's argmax given the
right tokens before it — then greedy decoding reproduces the target completion exactly, so this is
a lower bound of the call accuracy measured through the stack (`bench/bench_demo_accuracy.py`).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from services.demo.dialogs import DialogGenerator
from services.demo.encode import EncodedScene, SceneEncoder
from services.demo.vocab import TrainedVocab

HELDOUT_SEED = 1_000_003     # never a training seed: the held-out split also uses its own lists


def heldout_scenes(vocab: TrainedVocab, encoder: SceneEncoder, count: int,
                   training_values: Iterable[str], seed: int = HELDOUT_SEED) -> list[EncodedScene]:
    """`count` one-call held-out scenes whose argument values never occur in training and whose
    completion tokens are all trained (a model can only emit tokens it was trained on; the prompt
    may hold any token)."""
    seen = set(training_values)
    scenes: list[EncodedScene] = []
    for scene in _call_scenes(seed):
        encoded = encoder.scene(scene)
        example = encoded.examples[0]
        if vocab.covers(example.completion_ids) and not seen & set(example.example.novel_values):
            scenes.append(encoded)
        if len(scenes) == count:
            return scenes
    raise AssertionError("unreachable")


def _call_scenes(seed: int) -> Iterator:
    generator = DialogGenerator(seed, held_out=True)
    index = 0
    while True:
        yield generator.call_scene(index)
        index += 1


def teacher_forced(trainer, scenes: list[EncodedScene], quantized: bool) -> dict[str, float]:
    """Exact-completion share, token accuracy and MTP (token after next) accuracy."""
    seen = {t for s in scenes for e in s.examples for t in e.prompt_ids + e.completion_ids}
    rows = trainer.vocab.rows(sorted(seen - set(trainer.vocab.ids.tolist())))
    model = trainer.model(quantized, rows)
    exact, token, mtp = [], [], []
    with torch.no_grad():
        for scene in scenes:
            scores = trainer.score(model, rows, scene, with_mtp=True)
            exact.extend(scores.exact)
            token.append(scores.token_accuracy)
            mtp.append(scores.mtp_accuracy)
    return {"exact": sum(exact) / len(exact), "token_accuracy": sum(token) / len(token),
            "mtp_accuracy": sum(mtp) / len(mtp)}
