"""The V4 tokenizer: special tokens are single ids, text round-trips, and the incremental detokenizer
never emits half a UTF-8 character."""
from __future__ import annotations

from pathlib import Path

import pytest

from services.frontend import dsv4_tokens as tok
from services.frontend.tokenizer import Dsv4Tokenizer, bundled_tokenizer_dir

MULTIBYTE = "Grüße 世界 🎉🎉 naïve — ｜DSML｜ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👩‍👩‍👧"


@pytest.fixture(scope="module")
def tokenizer() -> Dsv4Tokenizer:
    return Dsv4Tokenizer(bundled_tokenizer_dir())


@pytest.mark.parametrize("text, token_id", [
    (tok.BOS, 0), (tok.EOS, 1), (tok.USER, 128803), (tok.ASSISTANT, 128804),
    (tok.THINK_START, 128821), (tok.THINK_END, 128822), (tok.DSML, 128825),
    (tok.LATEST_REMINDER, 128828)])
def test_special_token_texts_encode_to_single_ids(tokenizer: Dsv4Tokenizer, text: str,
                                                  token_id: int) -> None:
    assert tokenizer.encode(text) == [token_id]
    assert tokenizer.decode([token_id]) == text


def test_vocabulary_and_stop_ids(tokenizer: Dsv4Tokenizer) -> None:
    assert tokenizer.vocab_size == 129280
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1)


def test_encode_adds_no_special_tokens_and_round_trips(tokenizer: Dsv4Tokenizer) -> None:
    text = "def f(x):\n        return  x  # indented\n\t" + MULTIBYTE
    ids = tokenizer.encode(text)
    assert ids[0] != tokenizer.bos_token_id
    assert tokenizer.decode(ids) == text


def test_skip_special_tokens_drops_only_special_ones(tokenizer: Dsv4Tokenizer) -> None:
    ids = tokenizer.encode(f"{tok.BOS}a{tok.DSML}b</think>{tok.EOS}")
    assert tokenizer.decode(ids, skip_special_tokens=True) == f"a{tok.DSML}b</think>"


def test_incremental_detokenizer_holds_back_split_characters(tokenizer: Dsv4Tokenizer) -> None:
    ids = tokenizer.encode(MULTIBYTE)
    detokenizer = tokenizer.detokenizer()
    emitted, data, split_seen = "", b"", False
    for token_id in ids:
        emitted += detokenizer.feed([token_id])
        data += tokenizer.token_bytes(token_id)
        complete = _longest_complete_prefix(data)
        split_seen |= len(complete) < len(data)
        # after every token: exactly the complete characters so far, never a replacement char
        assert emitted == complete.decode("utf-8")
    assert split_seen, "the text must put a token boundary inside a multi-byte character"
    assert emitted + detokenizer.flush() == MULTIBYTE


def _longest_complete_prefix(data: bytes) -> bytes:
    for cut in range(4):
        try:
            (data[: len(data) - cut]).decode("utf-8")
            return data[: len(data) - cut]
        except UnicodeDecodeError:
            continue
    raise AssertionError("not UTF-8")


def test_detokenizer_output_matches_whole_decode_for_any_grouping(tokenizer: Dsv4Tokenizer) -> None:
    ids = tokenizer.encode(f"{tok.BOS}{MULTIBYTE}{tok.THINK_END}x{tok.EOS}")
    for group in (1, 2, 3, 7):
        detokenizer = tokenizer.detokenizer()
        text = "".join(detokenizer.feed(ids[i:i + group]) for i in range(0, len(ids), group))
        assert text + detokenizer.flush() == tokenizer.decode(ids)


def test_detokenizer_flush_replaces_an_unfinished_character(tokenizer: Dsv4Tokenizer) -> None:
    ids = tokenizer.encode("🎉")
    assert len(ids) > 1
    detokenizer = tokenizer.detokenizer()
    assert detokenizer.feed(ids[:1]) == ""
    assert detokenizer.flush() == "\ufffd"


def test_ids_outside_the_vocabulary_are_rejected(tokenizer: Dsv4Tokenizer) -> None:
    with pytest.raises(ValueError):
        tokenizer.decode([10**7])


def test_missing_tokenizer_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Dsv4Tokenizer(tmp_path)
