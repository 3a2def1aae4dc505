"""Argument values of the synthetic data: cities, people, paths, commands, dates, … per split.

Every maker draws from its split's lists (`lists.pool`). Both halves are widened with invented
names made of syllables (disjoint sets per half): they give the model many more token sequences to
learn copying on, and give the held-out half names whose pieces are trained tokens.
"""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Callable

from services.demo.lists import pool

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st",
           "t", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "th", "nd", "rk", "x")
SYNTHETIC_NAMES = 400
DOMAINS = ("example.com", "mail.com", "work.org")


@lru_cache(maxsize=None)
def synthetic_names(held_out: bool) -> tuple[str, ...]:
    """Invented capitalised names, seeded; the held-out set shares no name with the training set."""
    taken = set() if not held_out else set(synthetic_names(False))
    rng = random.Random(34 if held_out else 12)
    names: set[str] = set()
    while len(names) < SYNTHETIC_NAMES:
        name = _invented_name(rng)
        if name not in taken:
            names.add(name)
    return tuple(sorted(names))


def _invented_name(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.randint(2, 3))).capitalize()


def fresh_name(rng: random.Random, held_out: bool) -> str:
    """An invented name drawn anew (not from a list), never one of the other split's names."""
    other = _synthetic_name_set(not held_out)
    while (name := _invented_name(rng)) in other:
        pass
    return name


@lru_cache(maxsize=None)
def _synthetic_name_set(held_out: bool) -> frozenset[str]:
    # fresh_name runs for most fresh-phase values: the set is built once, not per draw.
    return frozenset(synthetic_names(held_out))


def drill_chain(rng: random.Random, held_out: bool) -> str:
    """2–4 values of the split's kinds in a row, fresh invented names among them: a value no
    list holds, so only copying reproduces it."""
    kinds = ("fresh_name", "fresh_name", "words", "city", "person", "path", "date", "clock_time")
    return " ".join(MAKERS[rng.choice(kinds)](rng, held_out) for _ in range(rng.randint(2, 4)))


def _names(kind: str, held_out: bool) -> tuple[str, ...]:
    return pool(kind, held_out) + synthetic_names(held_out)


def city(rng: random.Random, held_out: bool) -> str:
    return rng.choice(_names("city", held_out))


def person(rng: random.Random, held_out: bool) -> str:
    return rng.choice(_names("person", held_out))


def full_name(rng: random.Random, held_out: bool) -> str:
    return f"{person(rng, held_out)} {rng.choice(pool('surname', held_out))}"


def words(rng: random.Random, held_out: bool, low: int = 1, high: int = 3) -> str:
    return " ".join(rng.sample(pool("word", held_out), rng.randint(low, high)))


def title(rng: random.Random, held_out: bool) -> str:
    return words(rng, held_out, 1, 3).capitalize()


def sentence(rng: random.Random, held_out: bool) -> str:
    if held_out:
        return words(rng, held_out, 3, 4)
    return rng.choice(pool("language_text", held_out))


def directory(rng: random.Random, held_out: bool) -> str:
    return rng.choice(pool("dir", held_out))


def file_name(rng: random.Random, held_out: bool) -> str:
    stem = rng.choice(pool("stem", held_out)).replace(" ", "_")
    return stem + rng.choice(pool("ext", held_out))


def path(rng: random.Random, held_out: bool) -> str:
    return f"{directory(rng, held_out)}/{file_name(rng, held_out)}"


def email(rng: random.Random, held_out: bool) -> str:
    return f"{person(rng, held_out).lower()}@{rng.choice(DOMAINS)}"


def command(rng: random.Random, held_out: bool) -> str:
    kind = rng.random()
    if kind < 0.5:
        return rng.choice(pool("command", held_out))
    if kind < 0.7:
        return f"cat {path(rng, held_out)}"
    if kind < 0.85:
        return f"grep -n {rng.choice(pool('word', held_out))} {path(rng, held_out)}"
    return f"mkdir -p {directory(rng, held_out)}/{rng.choice(pool('word', held_out))}"


def ticker(rng: random.Random, held_out: bool) -> str:
    return rng.choice(pool("ticker", held_out))


def date(rng: random.Random, held_out: bool) -> str:
    # Held-out dates fall in another year, so no held-out date string occurs in training.
    year = 2027 if held_out else rng.choice((2024, 2025, 2026))
    return f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock_time(rng: random.Random, held_out: bool) -> str:
    minutes = (7, 23, 37, 52) if held_out else (0, 15, 30, 45)
    return f"{rng.randint(7, 20):02d}:{rng.choice(minutes):02d}"


MAKERS: dict[str, Callable[[random.Random, bool], str]] = {
    "city": city, "person": person, "full_name": full_name, "words": words, "title": title,
    "sentence": sentence, "directory": directory, "file_name": file_name, "path": path,
    "email": email, "command": command, "ticker": ticker, "date": date, "clock_time": clock_time,
    "fresh_name": fresh_name,
}
