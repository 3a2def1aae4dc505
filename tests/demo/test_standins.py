"""Stand-ins: an untrained word token is read as a trained spelling of the same word."""
from __future__ import annotations

import torch

from services.demo.encode import SceneEncoder
from services.demo.standins import (FIRST_PIECE_GAIN, add_spelt_traces, routing_ids,
                                    spelt_pieces, stand_ins, untrained_rows)

TOKENIZER = SceneEncoder().tokenizer


def ids(*tokens: str) -> tuple[int, ...]:
    return tuple(sorted(TOKENIZER.token_to_id(t) for t in tokens))


TRAINED = ids("Ġskipping", "Ġevery", "mon", "Ġhello")


def reads_as(token: str) -> tuple[str, int] | None:
    found = stand_ins(TRAINED).get(TOKENIZER.token_to_id(token))
    return None if found is None else (TOKENIZER.id_to_token(found.reads_as), found.space_sign)


def test_an_untrained_word_reads_as_the_same_letters_in_another_case_or_spacing() -> None:
    assert reads_as("Ġmon") == ("mon", 1)
    assert reads_as("Mon") == ("mon", 0)
    assert reads_as("hello") == ("Ġhello", -1)


def test_an_untrained_word_reads_as_the_nearest_trained_word_sharing_its_stem() -> None:
    assert reads_as("Ġskip") == ("Ġskipping", 0)          # the shortest longer word
    assert reads_as("Ġeverything") == ("Ġevery", 0)       # the longest word it extends
    assert reads_as("Ġeverywhere") == ("Ġevery", 0)


def test_short_words_and_words_without_a_relative_keep_the_mean_row() -> None:
    assert reads_as("Ġski") is None                        # 3 letters: too short for a stem
    assert reads_as("Ġweather") is None
    assert reads_as("Ġskipping") is None                   # trained: its own row


def test_rows_and_routing_follow_the_stand_in() -> None:
    generator = torch.Generator().manual_seed(0)
    trained = torch.randn(len(TRAINED), 8, generator=generator)
    row = dict(zip(TRAINED, trained))
    skip, other = TOKENIZER.token_to_id("Ġskip"), TOKENIZER.token_to_id("Ġweather")
    rows = untrained_rows(trained, TRAINED, [skip, other])
    assert torch.equal(rows[0], row[TOKENIZER.token_to_id("Ġskipping")])
    assert torch.allclose(rows[1], trained.mean(dim=0))
    assert routing_ids(TRAINED, [skip, other]) == [TOKENIZER.token_to_id("Ġskipping"), other]


def test_a_stand_in_across_the_leading_space_moves_by_the_trained_space_offset() -> None:
    trained_ids = ids("Ġhello", "hello", "mon")
    generator = torch.Generator().manual_seed(1)
    trained = torch.randn(len(trained_ids), 8, generator=generator)
    row = dict(zip(trained_ids, trained))
    space = row[TOKENIZER.token_to_id("Ġhello")] - row[TOKENIZER.token_to_id("hello")]
    spaced_mon = untrained_rows(trained, trained_ids, [TOKENIZER.token_to_id("Ġmon")])[0]
    assert torch.allclose(spaced_mon, row[TOKENIZER.token_to_id("mon")] + space)


SPELT_TRAINED = ids("Ġhello", "hello", "K", "ore", "s", "oup", "Ġsoup", "Ġweather")


def test_a_spaced_word_spelt_by_two_trained_pieces_is_a_spelt_token() -> None:
    pieces = spelt_pieces(SPELT_TRAINED)
    token = TOKENIZER.token_to_id
    assert pieces[token("ĠKore")] == (token("K"), token("ore"))      # untrained
    assert pieces[token("Ġsoup")] == (token("s"), token("oup"))      # trained
    assert token("Ġhello") not in pieces                              # its bare twin is trained
    assert token("Ġweather") not in pieces                            # weather: no trained pieces


def test_spelt_rows_carry_a_trace_of_their_pieces_trained_or_not() -> None:
    generator = torch.Generator().manual_seed(2)
    trained = torch.randn(len(SPELT_TRAINED), 8, generator=generator)
    spell = torch.randn(9, 8, generator=generator)          # 8 × 8 and the mark
    row = dict(zip(SPELT_TRAINED, trained))
    token = TOKENIZER.token_to_id
    kore = untrained_rows(trained, SPELT_TRAINED, [token("ĠKore")], spell)[0]
    mean = trained.mean(dim=0)                                          # no stand-in
    trace = FIRST_PIECE_GAIN * row[token("K")] + row[token("ore")] @ spell[:8] + spell[8]
    assert torch.allclose(kore, mean + trace)
    traced = dict(zip(SPELT_TRAINED, add_spelt_traces(trained, SPELT_TRAINED, trained,
                                                      SPELT_TRAINED, spell)))
    assert torch.allclose(traced[token("Ġsoup")], row[token("Ġsoup")]
                          + FIRST_PIECE_GAIN * row[token("s")] + row[token("oup")] @ spell[:8]
                          + spell[8])
    assert torch.equal(traced[token("Ġweather")], row[token("Ġweather")])
    assert routing_ids(SPELT_TRAINED, [token("ĠKore"), token("Ġsoup")], spelt=True) == [
        token("K"), token("Ġsoup")]
