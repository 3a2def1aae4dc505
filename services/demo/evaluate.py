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
from services.demo.scene import Example
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


def copy_evalsets(trainer, count: int) -> dict[str, list[EncodedScene]]:
    """The copy metric's held-out sets: `count` one-call scenes, `count` drills of held-out list
    values in a row (names, places, words) and `count` drills of random token strings. Drills are
    kept only if their completion is inside the trained vocabulary."""
    chains = DialogGenerator(HELDOUT_SEED, held_out=True).drill_scene(0, count)
    randoms = trainer.random_drills.scene(0, count, held_out=True)
    return {"calls": heldout_scenes(trainer.vocab, trainer.encoder, count, trainer.training_values),
            "chains": _covered(trainer, chains), "random": _covered(trainer, randoms)}


def copy_accuracy(trainer, scenes: list[EncodedScene]) -> dict[str, float]:
    """Teacher-forced, after quantization: the share of copied values' first tokens and of their
    other tokens that are the argmax, and the share of exact completions. A call's copied values
    are its free-form arguments (enum members and named commands are chosen, not copied)."""
    model, rows = _model_for(trainer, scenes, quantized=True)
    first, rest, exact = [], [], []
    with torch.no_grad():
        for scene in scenes:
            scores = trainer.score(model, rows, scene, with_mtp=False)
            exact.extend(scores.exact)
            for example, correct in zip(scene.examples, scores.correct):
                text = trainer.encoder.tokenizer.decode(example.completion_ids,
                                                        skip_special_tokens=False)
                for tokens in trainer.encoder.value_tokens(example.completion_ids, text,
                                                           _copied(example.example)):
                    first.append(correct[tokens[0]])
                    rest.extend(correct[n] for n in tokens[1:])
    return {"first": _share(first), "rest": _share(rest), "exact": _share(exact)}


def _copied(example: Example) -> list[str]:
    return example.novel_values if example.kind == "call" else example.copy_values


def _covered(trainer, scene) -> list[EncodedScene]:
    """The scene without the examples whose completion holds an untrained token (none left: [])."""
    encoded = trainer.encoder.scene(scene)
    kept = [e for e in encoded.examples if trainer.vocab.covers(e.completion_ids)]
    return [EncodedScene(encoded.prefix_ids, kept, scene)] if kept else []


def _share(flags: list[bool]) -> float:
    return sum(flags) / max(1, len(flags))


def _model_for(trainer, scenes: list[EncodedScene], quantized: bool):
    """The model with rows for every token of `scenes` (untrained ones: as export.py gives them)."""
    seen = {t for s in scenes for e in s.examples for t in e.prompt_ids + e.completion_ids}
    rows = trainer.vocab.rows(sorted(seen - set(trainer.vocab.ids.tolist())))
    return trainer.model(quantized, rows), rows


def teacher_forced(trainer, scenes: list[EncodedScene], quantized: bool) -> dict[str, float]:
    """Exact-completion share, token accuracy and MTP (token after next) accuracy."""
    model, rows = _model_for(trainer, scenes, quantized)
    exact, token, mtp = [], [], []
    with torch.no_grad():
        for scene in scenes:
            scores = trainer.score(model, rows, scene, with_mtp=True)
            exact.extend(scores.exact)
            token.append(scores.token_accuracy)
            mtp.append(scores.mtp_accuracy)
    return {"exact": sum(exact) / len(exact), "token_accuracy": sum(token) / len(token),
            "mtp_accuracy": sum(mtp) / len(mtp)}
