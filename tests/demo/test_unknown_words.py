"""Unknown words in training requests: inserted into call requests only, outside the trained
vocabulary, never in or next to a copied value, the target unchanged; a fresh-phase step learns
from them with their rows the mean rows serving gives every untrained token."""
from __future__ import annotations

from pathlib import Path

import pytest

from services.demo.encode import SPACE
from services.demo.heldout_values import HeldOutValues
from services.demo.trainer import Trainer, TrainSettings
from services.demo.unknown_words import UnknownWords
from services.frontend.chat_format import render_chat_request


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    settings = TrainSettings(steps=1, examples_per_scene=4, copy_steps=0, fresh_steps=2,
                             fresh_examples=4, fresh_random_drills=2, long_drills=2,
                             fresh_unknown_words=1.0)
    trainer = Trainer(tmp_path_factory.mktemp("run"), settings)
    # A one-scene vocabulary covers scene 0 only: the fresh stream is asked for and scene 0 given,
    # and the held-out guard has nothing to search (as in test_training.py).
    stream = trainer.generator.training_scenes
    trainer.fresh_generator.training_scenes = lambda index, examples, drills: stream(0, examples, 0)
    trainer._heldout_values = HeldOutValues((), False)
    return trainer


def _without(prompt: list[int], inserted: list[int]) -> list[int]:
    rest = list(prompt)
    for token_id in inserted:
        rest.remove(token_id)
    return rest


def test_unknown_words_go_into_call_requests_between_words_outside_every_value(
        trainer: Trainer) -> None:
    scenes = trainer.training_scenes(1)
    changed = trainer.unknown_words.scenes(scenes, 1)
    tokenizer = trainer.encoder.tokenizer
    calls = 0
    for before, after in zip(scenes, changed):
        assert after.prefix_ids == before.prefix_ids
        for old, new in zip(before.examples, after.examples):
            assert new.completion_ids == old.completion_ids and new.key_tokens == old.key_tokens
            if old.example.kind != "call":
                assert new.prompt_ids == old.prompt_ids
                continue
            calls += 1
            inserted = trainer.vocab.outside(new.prompt_ids)
            assert 1 <= len(new.prompt_ids) - len(old.prompt_ids) <= 2
            assert inserted and _without(new.prompt_ids, inserted) == old.prompt_ids
            assert all(tokenizer.id_to_token(i).startswith(SPACE) for i in inserted)
            text = tokenizer.decode(new.prompt_ids, skip_special_tokens=False)
            request = old.example.messages[-1]["content"]
            for value in old.example.copy_values:   # whole, with the words either side of it
                if value in request:
                    at = request.index(value)
                    left = request.rfind(" ", 0, max(0, at - 1)) + 1
                    right = request.find(" ", at + len(value) + 1)
                    assert request[left:right if right >= 0 else None] in text
    assert calls >= 2


def test_a_step_inserts_the_same_words_every_time_it_runs(trainer: Trainer) -> None:
    """A resumed run learns exactly the stream it would have learnt."""
    again = UnknownWords(trainer.vocab, trainer.encoder, trainer.settings.seed, 1.0)
    scenes = trainer.training_scenes(1)
    first, second = trainer.unknown_words.scenes(scenes, 1), again.scenes(scenes, 1)
    assert [[e.prompt_ids for e in s.examples] for s in first] == \
        [[e.prompt_ids for e in s.examples] for s in second]


def test_a_fresh_phase_step_learns_requests_with_unknown_words(trainer: Trainer) -> None:
    """The step's model has a row for every inserted id (the mean of the trained rows)."""
    trainer.step_index = 1
    record = trainer.train_step()
    assert record["step"] == 2 and record["loss"] > 0


def test_words_go_before_the_requests_words_but_not_in_or_next_to_a_value(
        trainer: Trainer) -> None:
    prompt = trainer.encoder.encode(render_chat_request({"messages": [
        {"role": "user", "content": "Please search the web for soup storage rivers today thanks"}]}
    ).text)
    positions = trainer.unknown_words.insert_positions(prompt, ["soup storage rivers"])
    tokenizer = trainer.encoder.tokenizer
    assert [tokenizer.id_to_token(prompt[n]) for n in positions] == [
        f"{SPACE}search", f"{SPACE}the", f"{SPACE}web", f"{SPACE}for", f"{SPACE}thanks"]
