"""Argument values drawn anew for every example: the fresh phase's makers (training split only).

The lists of values.py are small enough for a tiny model to learn by heart, and it does: the
committed step-700 model writes a training city or ticker where a held-out one should be copied
(docs/demo-model.md). Every maker here draws from a space far too large to recall — invented
names, word combinations, paths built from them, tickers of random letters, dates and times whose
every digit varies — so the one way to get a value right is to copy it out of the request. Same
kinds and signatures as `values.MAKERS` (the `held_out` argument is accepted and ignored: these
makers serve training; the trainer keeps held-out values out of its examples).
"""
from __future__ import annotations

import random
import re
import string
from functools import cache, partial
from typing import Callable

from services.demo import values
from services.demo.encode import SceneEncoder
from services.demo.lists import pool

Maker = Callable[[random.Random, bool], str]


def name(rng: random.Random, held_out: bool = False) -> str:
    """A capitalised invented name; one in five has two words."""
    first = values.fresh_name(rng, False)
    return first if rng.random() < 0.8 else f"{first} {values.fresh_name(rng, False)}"


def full_name(rng: random.Random, held_out: bool = False) -> str:
    return f"{values.fresh_name(rng, False)} {values.fresh_name(rng, False)}"


def lower_name(rng: random.Random) -> str:
    return values.fresh_name(rng, False).lower()


def words(rng: random.Random, held_out: bool = False, low: int = 1, high: int = 3) -> str:
    """Words of the shared pool, with an invented lower-case word among them now and then."""
    chosen = rng.sample(pool("word", False), rng.randint(low, high))
    if rng.random() < 0.3:
        chosen[rng.randrange(len(chosen))] = lower_name(rng)
    return " ".join(chosen)


def title(rng: random.Random, held_out: bool = False) -> str:
    return words(rng, False, 1, 3).capitalize()


def sentence(rng: random.Random, held_out: bool = False) -> str:
    return words(rng, False, 3, 5)


# With path parts, a share of path components are the training lists' own directory names and
# file stems ("log", "backup", "data", "alice") in new combinations. Without them a listed name
# only ever came whole ("/srv", "/data"), so the step-3900 model cut held-out paths short where a
# listed value ends ("/srv" for /srv/data) and never copied a slash-merged token ("/data", "/c")
# after another component.
PATH_PART_SHARE = 0.4


@cache
def path_parts() -> list[str]:
    """The components of the training split's directories, and its file stems."""
    dirs = {part for entry in pool("dir", False) for part in re.split(r"[/~.]+", entry) if part}
    return sorted(dirs | set(pool("stem", False)))


def _component(rng: random.Random, parts: bool = False) -> str:
    if parts and rng.random() < PATH_PART_SHARE:
        return rng.choice(path_parts())
    return rng.choice(pool("word", False)) if rng.random() < 0.5 else lower_name(rng)


def directory(rng: random.Random, held_out: bool = False, parts: bool = False) -> str:
    root = rng.choice(("/", "/", "~/", "./", "/home/", "/srv/", "/var/"))
    return root + "/".join(_component(rng, parts) for _ in range(rng.randint(1, 3)))


def file_name(rng: random.Random, held_out: bool = False, parts: bool = False) -> str:
    stem = "_".join(_component(rng, parts) for _ in range(rng.randint(1, 2)))
    return stem + rng.choice(pool("ext", False))


def path(rng: random.Random, held_out: bool = False, parts: bool = False) -> str:
    return f"{directory(rng, parts=parts)}/{file_name(rng, parts=parts)}"


def email(rng: random.Random, held_out: bool = False) -> str:
    return f"{lower_name(rng)}@{rng.choice(values.DOMAINS)}"


def command(rng: random.Random, held_out: bool = False, parts: bool = False) -> str:
    shapes = (lambda: rng.choice(pool("command", False)),
              lambda: f"cat {path(rng, parts=parts)}",
              lambda: f"grep -n {_component(rng, parts)} {path(rng, parts=parts)}",
              lambda: f"mkdir -p {directory(rng, parts=parts)}",
              lambda: f"ls -la {directory(rng, parts=parts)}",
              lambda: f"tail -n {rng.randint(5, 200)} {path(rng, parts=parts)}",
              lambda: f"{_component(rng, parts)} --{_component(rng, parts)}")
    return rng.choice(shapes)()


def ticker(rng: random.Random, held_out: bool = False) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=rng.randint(2, 5)))


def date(rng: random.Random, held_out: bool = False) -> str:
    return f"{rng.randint(2000, 2039)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock_time(rng: random.Random, held_out: bool = False) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"


def drill_chain(rng: random.Random, held_out: bool = False) -> str:
    """2–4 fresh values of mixed kinds in a row (the long drills of the fresh phase)."""
    kinds = ("city", "person", "words", "path", "date", "clock_time", "ticker", "command")
    return " ".join(MAKERS[rng.choice(kinds)](rng, False) for _ in range(rng.randint(2, 4)))


MAKERS: dict[str, Maker] = {
    "city": name, "person": name, "full_name": full_name, "words": words, "title": title,
    "sentence": sentence, "directory": directory, "file_name": file_name, "path": path,
    "email": email, "command": command, "ticker": ticker, "date": date, "clock_time": clock_time,
    "fresh_name": name,
}

# Words in a free-text value of the long variant: mostly 2–4 (mean 2.7, the plain makers' 2.0).
# The committed step-1100 model's commonest held-out miss is a value of several words that loses,
# repeats or reorders a word (`"rowing rowing"` for `rowing java`): every word after the first is
# a copy that must follow the request's order, and longer values train more of them.
LONG_WORD_COUNTS = (1, 2, 2, 3, 3, 4, 4)


def long_words(rng: random.Random, held_out: bool = False) -> str:
    count = rng.choice(LONG_WORD_COUNTS)
    return words(rng, False, count, count)


def long_title(rng: random.Random, held_out: bool = False) -> str:
    return long_words(rng).capitalize()


def long_sentence(rng: random.Random, held_out: bool = False) -> str:
    return words(rng, False, 3, 6)


LONG_MAKERS: dict[str, Maker] = {**MAKERS, "words": long_words, "title": long_title,
                                 "sentence": long_sentence}

# The makers that build paths, with path parts (`with_path_parts`).
PATH_PART_MAKERS: dict[str, Maker] = {kind: partial(maker, parts=True) for kind, maker in
                                      (("directory", directory), ("file_name", file_name),
                                       ("path", path), ("command", command))}


def with_path_parts(makers: dict[str, Maker]) -> dict[str, Maker]:
    return {**makers, **PATH_PART_MAKERS}


# Listed names: the training lists' real cities and first names ("Madrid", "Oslo", "Alice") in
# place of an invented one. The invented names are pieces either way (` Mub`+`al` in the request,
# `Mub`+`al` in the call), while a real word is often one spaced token in the request (` Madrid`)
# spelled in other pieces in the call (`Mad`+`rid`). With invented names only, run H3 copied 15
# of 100 real cities right (docs/demo-model.md): it had never been asked to respell.
def _listed_or(kind: str, maker: Maker, share: float) -> Maker:
    def make(rng: random.Random, held_out: bool = False) -> str:
        return rng.choice(pool(kind, False)) if rng.random() < share else maker(rng)
    return make


LISTED_NAME_KINDS = ("city", "person", "surname")


def listed_name(rng: random.Random, held_out: bool = False) -> str:
    """A city, first name or surname of the training lists."""
    return rng.choice(pool(rng.choice(LISTED_NAME_KINDS), False))


def _listed_full_name(share: float) -> Maker:
    person, surname = _listed_or("person", name, share), _listed_or("surname", name, share)
    return lambda rng, held_out=False: f"{person(rng).split()[0]} {surname(rng).split()[0]}"


def with_listed_names(makers: dict[str, Maker], share: float) -> dict[str, Maker]:
    """`makers` whose city, person and full names are, in `share` of draws (for each word of a
    full name), an entry of the training half's lists instead of an invented name."""
    return {**makers, "city": _listed_or("city", makers["city"], share),
            "person": _listed_or("person", makers["person"], share),
            "full_name": _listed_full_name(share)}


# Short options: a share of commands are a listed command's name with 1–2 option letters ("df -k",
# "free -g", "uname -m"). The training list spells each command one way ("df -h", also the answer
# to "Show disk usage"), so run H3 wrote the held-out "df -i" as "df -h" (3 of 200 held-out
# prompts): the option came with the name, recalled rather than copied. A drawn command that holds
# a held-out one ("df -i") is refused like any held-out value (heldout_values.py).
SHORT_OPTION_SHARE = 0.3


@cache
def command_names() -> list[str]:
    """The first words of the training list's commands."""
    return sorted({entry.split()[0] for entry in pool("command", False)})


def short_option_command(rng: random.Random, held_out: bool = False) -> str:
    options = "".join(rng.sample(string.ascii_lowercase, rng.randint(1, 2)))
    return f"{rng.choice(command_names())} -{options}"


def with_short_options(makers: dict[str, Maker]) -> dict[str, Maker]:
    """`makers` whose commands are, in SHORT_OPTION_SHARE of draws, `short_option_command`."""
    command = makers["command"]

    def make(rng: random.Random, held_out: bool = False) -> str:
        return short_option_command(rng) if rng.random() < SHORT_OPTION_SHARE else command(rng)
    return {**makers, "command": make}


# Slash ends: a share of directories and paths end with a word that BPE merges with the slash
# before it ("/srv/log/config": `/config`). Paths end with a file name, so of the slash-merged
# pieces in 300 steps of fresh values 30 of 2,341 end one (in the listed values' stream 40 of
# 1,551; with slash ends 444 of 2,532), and run H3 writes a directory that ends in one with the
# piece twice (`/srv/config/config`, the held-out `/srv/data` as `/srv/data/data`).
SLASH_END_SHARE = 0.4


@cache
def slash_end_words() -> list[str]:
    """The path parts and pool words that BPE spells with the slash before them as one token."""
    tokenizer = SceneEncoder().tokenizer
    return sorted({word for word in (*path_parts(), *pool("word", False))
                   if tokenizer.token_to_id("/" + word) is not None})


def with_slash_ends(makers: dict[str, Maker]) -> dict[str, Maker]:
    """`makers` whose directories and paths are, in SLASH_END_SHARE of draws, a directory with a
    `slash_end_words` word after it (a file without an extension, as `/etc/hosts`)."""
    directory_maker = makers["directory"]

    def slash_end(maker: Maker) -> Maker:
        def make(rng: random.Random, held_out: bool = False) -> str:
            if rng.random() < SLASH_END_SHARE:
                return f"{directory_maker(rng)}/{rng.choice(slash_end_words())}"
            return maker(rng)
        return make
    return {**makers, "directory": slash_end(directory_maker), "path": slash_end(makers["path"])}


# Letter starts: a share of free-text values start with a pool word whose call spelling begins
# with a piece of one letter (` soup` in the request is `s`+`oup` after `">`). Every run since run
# R writes the four such words whose piece is `s` wrong at a value's start (soup as `football`),
# and the 32 with other letters right; `s` is mostly an ending (in 60 steps of run G's stream it
# starts 34 of 2,948 string values; 61 of 3,003 with letter starts). Run I2 (120 steps with them)
# still gets all four wrong: after a forced `s` it copies ` soup` whole (docs/demo-model.md).
LETTER_START_SHARE = 0.5
LOWER_CASE_TEXT_KINDS = ("words", "sentence")   # a title's capital starts a one-letter piece often


@cache
def letter_start_words() -> list[str]:
    """The pool words whose spelling without a leading space starts with a one-letter piece."""
    tokenizer = SceneEncoder().tokenizer
    return [word for word in pool("word", False)
            if len(tokenizer.encode(word, add_special_tokens=False).tokens[0]) == 1]


@cache
def s_start_words() -> list[str]:
    """The `letter_start_words` whose one-letter first piece is `s`."""
    return [word for word in letter_start_words() if word.startswith("s")]


def with_letter_starts(makers: dict[str, Maker], s_share: float = 0.0) -> dict[str, Maker]:
    """`makers` whose lower-case free-text values start, in LETTER_START_SHARE of draws, with a
    `letter_start_words` word in place of their first word; in `s_share` of those, one of the
    words spelt from `s` (soup, sprint, soccer, sailing: drawn evenly, they start ~1 value in 16)."""
    def letter_start(maker: Maker) -> Maker:
        def make(rng: random.Random, held_out: bool = False) -> str:
            value = maker(rng)
            if rng.random() >= LETTER_START_SHARE:
                return value
            rest = value.split(" ")[1:]
            words = (s_start_words() if s_share and rng.random() < s_share
                     else letter_start_words())
            start = rng.choice([word for word in words if word not in rest])
            return " ".join([start, *rest])
        return make
    return {**makers, **{kind: letter_start(makers[kind]) for kind in LOWER_CASE_TEXT_KINDS}}
