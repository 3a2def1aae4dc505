"""Stand-ins: the trained token an untrained word token is read as when the demo model is expanded.

The demo model trains only the rows its data uses; every other token used to embed as the mean of
the trained rows, an input no training step ever showed the model. A user's word is often another
spelling of a trained one: ` skip` where training said ` skipping`, ` everything` next to
` every`, `Which` next to ` which`, the request's ` mon` (with its space) of an e-mail address whose
call writes the trained `mon`. Expansion gives such a token the `embed` row and the hash-routing
row of its stand-in, so the model reads the word it knows. The `head` row stays the mean, so an
untrained token still never wins the argmax (export.py).

A stand-in is, in this order of preference: the same letters with another case or leading space;
else, for words of MIN_STEM_CHARS letters or more, the shortest trained word that extends the word
(` skip` → ` skipping`); else the longest trained word of MIN_STEM_CHARS letters or more that the
word extends (` everything` → ` every`). Ties go to the same leading space, then the same case,
then the lower id. When the stand-in's leading space differs, the mean difference between trained
spaced tokens and their bare twins is added or taken away (the tie structure of vocab.py builds a
spaced row from its bare twin's base and one shared space vector).

Spelt tokens (`train-demo --spelt-embeddings`): a spaced word token whose bare spelling is no
trained token but exactly two (` soup` is `s` `oup` after a quote, ` Kore` is `K` `ore`) carries
a trace of its pieces in its `embed` row: its own row (trained, stand-in or mean) plus
FIRST_PIECE_GAIN · row(first) + row(second) @ S + m, with the matrix S [D, D] and the mark m [D]
learned (`spell` is S with m as its last row). A call that starts a value with such a word must
write the pieces, and a row of the word's own tells the model nothing about them; the trace
does, for every such token alike, trained or not (4,609 under the committed vocabulary, 4,177 of
them without a row), and the mark, one direction, tells the model the word is spelt at all. An
untrained spelt token without a stand-in takes the hash-routing row of its first piece.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch
from tokenizers import Tokenizer

from services.demo.encode import SPACE, SceneEncoder

MIN_STEM_CHARS = 4
FIRST_PIECE_GAIN = 0.25


@dataclass(frozen=True)
class Spelling:
    token_id: int
    spaced: bool
    word: str             # the letters, case kept

    @property
    def key(self) -> str:
        return self.word.lower()


@dataclass(frozen=True)
class StandIn:
    reads_as: int         # the trained token whose rows the untrained one takes
    space_sign: int       # +1: add the space offset, -1: take it away, 0: the rows as they are


@lru_cache(maxsize=4)
def spelt_pieces(trained_ids: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """The two trained pieces of every spelt token of the V4 vocabulary (see the module text)."""
    tokenizer = _tokenizer()
    trained = set(trained_ids)
    found = {}
    for token_id in range(tokenizer.get_vocab_size()):
        spelling = _spelling(tokenizer, token_id)
        if (spelling is None or not spelling.spaced
                or tokenizer.token_to_id(spelling.word) in trained):
            continue
        pieces = tokenizer.encode(spelling.word, add_special_tokens=False).ids
        if len(pieces) == 2 and set(pieces) <= trained:
            found[token_id] = (pieces[0], pieces[1])
    return found


def spelt_traces(rows: torch.Tensor, trained_ids: tuple[int, ...], token_ids: list[int],
                 spell: torch.Tensor) -> torch.Tensor:
    """[len(token_ids), D]: FIRST_PIECE_GAIN · row(first) + row(second) @ spell[:D] + spell[D]
    for spelt `token_ids`, their pieces' rows taken from `rows` (the trained rows, in the order
    of `trained_ids`); `spell` is [D + 1, D], its last row the mark every spelt token carries."""
    pieces = spelt_pieces(trained_ids)
    row_of = _row_of(trained_ids)
    first = torch.tensor([row_of[pieces[t][0]] for t in token_ids], dtype=torch.int64)
    second = torch.tensor([row_of[pieces[t][1]] for t in token_ids], dtype=torch.int64)
    return FIRST_PIECE_GAIN * rows[first] + rows[second] @ spell[:-1] + spell[-1]


def trained_spelt(trained_ids: tuple[int, ...]) -> list[int]:
    """Row indices of the trained spelt tokens."""
    pieces = spelt_pieces(trained_ids)
    return [row for row, token_id in enumerate(trained_ids) if token_id in pieces]


def add_spelt_traces(rows: torch.Tensor, token_ids: Sequence[int], pieces_from: torch.Tensor,
                     trained_ids: tuple[int, ...], spell: torch.Tensor) -> torch.Tensor:
    """`rows` ([len(token_ids), D]) with each spelt token's trace added, its pieces' rows taken
    from `pieces_from` (the trained rows, in the order of `trained_ids`)."""
    pieces = spelt_pieces(trained_ids)
    spelt = [k for k, token_id in enumerate(token_ids) if token_id in pieces]
    if not spelt:
        return rows
    traces = spelt_traces(pieces_from, trained_ids, [token_ids[k] for k in spelt], spell)
    return rows.index_add(0, torch.tensor(spelt, dtype=torch.int64), traces)


@lru_cache(maxsize=4)
def stand_ins(trained_ids: tuple[int, ...]) -> dict[int, StandIn]:
    """The stand-in of every untrained alphabetic token of the V4 vocabulary that has one."""
    tokenizer = _tokenizer()
    by_key: dict[str, list[Spelling]] = {}
    for token_id in trained_ids:
        spelling = _spelling(tokenizer, token_id)
        if spelling is not None:
            by_key.setdefault(spelling.key, []).append(spelling)
    finder = _Finder(by_key)
    trained = set(trained_ids)
    found = {}
    for token_id in range(tokenizer.get_vocab_size()):
        spelling = None if token_id in trained else _spelling(tokenizer, token_id)
        match = finder.find(spelling) if spelling is not None else None
        if match is not None:
            found[token_id] = StandIn(match.token_id, int(spelling.spaced) - int(match.spaced))
    return found


def untrained_rows(trained: torch.Tensor, trained_ids: tuple[int, ...], token_ids: list[int],
                   spell: torch.Tensor | None = None) -> torch.Tensor:
    """[len(token_ids), D] float32 `embed` rows of untrained tokens: the stand-in's row (shifted
    by the space offset where the leading space differs), else the mean of the trained rows;
    with `spell`, plus a spelt token's trace. `trained` holds the trained rows in the order of
    `trained_ids`; gradients flow into it."""
    rows = _stand_in_rows(trained, trained_ids, token_ids)
    if spell is None:
        return rows
    return add_spelt_traces(rows, token_ids, trained, trained_ids, spell)


def _stand_in_rows(trained: torch.Tensor, trained_ids: tuple[int, ...], token_ids: list[int]
                   ) -> torch.Tensor:
    found = stand_ins(trained_ids)
    row_of = _row_of(trained_ids)
    mean_row = len(trained_ids)          # the index of the mean in `choices`
    choices = torch.cat([trained, trained.mean(dim=0, keepdim=True)])
    sources = torch.tensor([row_of[found[t].reads_as] if t in found else mean_row
                            for t in token_ids], dtype=torch.int64)
    signs = torch.tensor([found[t].space_sign if t in found else 0 for t in token_ids],
                         dtype=trained.dtype)
    return choices[sources] + signs[:, None] * space_offset(trained, trained_ids)


def routing_ids(trained_ids: tuple[int, ...], token_ids: list[int], spelt: bool = False
                ) -> list[int]:
    """The ids whose hash-routing rows `token_ids` take: a stand-in's for an untrained token
    that has one; with `spelt`, an untrained spelt token's first piece's; its own otherwise."""
    found = stand_ins(trained_ids)
    pieces = spelt_pieces(trained_ids) if spelt else {}
    trained = set(trained_ids)
    return [found[t].reads_as if t in found
            else pieces[t][0] if t in pieces and t not in trained else t for t in token_ids]


def space_offset(trained: torch.Tensor, trained_ids: tuple[int, ...]) -> torch.Tensor:
    """[D]: the mean of row(` w`) − row(`w`) over the trained spaced tokens whose bare twin is
    trained; zero without such pairs."""
    spaced, bare = _space_pairs(trained_ids)
    if not spaced:
        return trained.new_zeros(trained.shape[1])
    return (trained[list(spaced)] - trained[list(bare)]).mean(dim=0)


@lru_cache(maxsize=4)
def _space_pairs(trained_ids: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Row indices of the trained spaced tokens and of their trained bare twins."""
    tokenizer = _tokenizer()
    row_of = _row_of(trained_ids)
    pairs = [(row_of[t], row_of[bare]) for t in trained_ids
             if tokenizer.id_to_token(t).startswith(SPACE)
             and (bare := tokenizer.token_to_id(tokenizer.id_to_token(t)[1:])) in row_of]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


@lru_cache(maxsize=4)
def _row_of(trained_ids: tuple[int, ...]) -> dict[int, int]:
    return {token_id: row for row, token_id in enumerate(trained_ids)}


@lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    return SceneEncoder().tokenizer


class _Finder:
    def __init__(self, by_key: dict[str, list[Spelling]]):
        self.by_key = by_key
        self.keys = sorted(by_key)

    def find(self, spelling: Spelling) -> Spelling | None:
        key = spelling.key
        if key in self.by_key:
            return _closest(self.by_key[key], spelling)
        if len(key) < MIN_STEM_CHARS:
            return None
        longer = self._extensions(key)
        if longer:
            return _closest(self.by_key[min(longer, key=len)], spelling)
        for end in range(len(key) - 1, MIN_STEM_CHARS - 1, -1):
            if key[:end] in self.by_key:
                return _closest(self.by_key[key[:end]], spelling)
        return None

    def _extensions(self, key: str) -> list[str]:
        start = bisect.bisect_right(self.keys, key)
        found = []
        for other in self.keys[start:]:
            if not other.startswith(key):
                break
            found.append(other)
        return found


def _closest(spellings: list[Spelling], spelling: Spelling) -> Spelling:
    return min(spellings, key=lambda s: (s.spaced != spelling.spaced, s.word[0] != spelling.word[0],
                                         s.token_id))


def _spelling(tokenizer: Tokenizer, token_id: int) -> Spelling | None:
    text = tokenizer.id_to_token(token_id)
    spaced = text.startswith(SPACE)
    word = text[1:] if spaced else text
    if not (word.isascii() and word.isalpha()):
        return None
    return Spelling(token_id, spaced, word)
