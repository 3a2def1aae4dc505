"""Copy drills of random token strings: the induction phase's data.

A value is 2–8 ids drawn uniformly from the trained vocabulary's word-like rows (letters and
digits, with or without a leading space), decoded to text; with a slash share, that share of the
ids after the first are slash-merged path pieces instead ("/data", "/c": BPE merges a slash with
the letters after it), which word-like rows leave out. Nothing about such a string can be
recalled from training — each one is new — so only copying the prompt's tokens gets it right: the
data on which small transformers form induction (copy) heads. A string is kept only if the
prompt's tokenization spells it with exactly the drawn ids (BPE may merge neighbours), so the
completion copies them token for token.

The span phase's variants (`repeats`, `shared`) make a copy find where a value starts and where it
ends, which copying by content alone does not: a string with a repeated token (after "a b a" the
next token is the one after the *second* "a") and calls whose values are drawn from a few tokens
shared by every value of the scene (the request holds other values made of the same tokens, and
words after a value that could continue it).
"""
from __future__ import annotations

import random
from typing import Callable

from services.demo.call_text import tool_json
from services.demo.dialogs import SYSTEM_PROMPTS, DialogGenerator
from services.demo.encode import SPACE, SceneEncoder, contains_run
from services.demo.scene import Example, Scene
from services.demo.tools import CATALOG
from services.demo.vocab import TrainedVocab

REPEAT_PROMPTS = ("Repeat after me: {value}", "Please repeat this: {value}", "Echo: {value}",
                  "Copy this exactly: {value}")   # the value follows a space in every one
MIN_TOKENS, MAX_TOKENS = 2, 8
SHARED_PIECES = (4, 8, 16)   # tokens a span scene's values are drawn from


class RandomDrills:
    """Random-string drills over one trained vocabulary, seeded per (seed, split, index)."""

    def __init__(self, vocab: TrainedVocab, encoder: SceneEncoder, seed: int):
        self.encoder = encoder
        self.seed = seed
        trained = set(vocab.ids.tolist())
        texts = {i: encoder.tokenizer.id_to_token(i) for i in sorted(trained)}
        self.pieces = [i for i, t in texts.items() if _word_like(t.removeprefix(SPACE))]
        self.slash_pieces = [i for i, t in texts.items()
                             if t.startswith("/") and _word_like(t[1:])]
        # A value's first token follows a space in the prompt and loses it in the completion
        # (encode.py): both forms must be trained.
        self.firsts = [i for i in self.pieces if texts[i].startswith(SPACE)
                       and encoder.tokenizer.token_to_id(texts[i][1:]) in trained]
        # Spaced tokens whose spelling without the space is 2+ trained tokens (` soup` is `s`+`oup`
        # after `">`): at a value's start a copy must respell them.
        self.respelt_firsts = [i for i in self.pieces if texts[i].startswith(SPACE)
                               and encoder.tokenizer.token_to_id(texts[i][1:]) not in trained
                               and _spelt_within(encoder, texts[i][1:], trained)]

    def scene(self, index: int, count: int, held_out: bool = False, repeats: bool = False,
              slash_share: float = 0.0) -> Scene:
        """`count` drills "Repeat after me: <random string>" answered by the string (no tools,
        chat mode: the completion is the copied tokens and the token that ends the turn); none
        if the vocabulary has no word-like token in both its spaced and bare forms. With
        `repeats`, every string of 3 tokens or more repeats one of its earlier tokens; with
        `slash_share`, that share of the tokens after the first are slash-merged pieces."""
        tag = "repeat-drill" if repeats else "random-drill"
        rng = random.Random(f"{self.seed}:{held_out}:{tag}:{index}")
        examples = []
        for _ in range(count if self.firsts else 0):
            user, value = self._request(rng, repeats, slash_share)
            examples.append(Example("chat", [{"role": "user", "content": user}],
                                    {"role": "assistant", "content": value}, False, [value]))
        return Scene(None, [], examples)

    def call_scene(self, index: int, count: int, shared: bool = False, respelt: bool = False
                   ) -> Scene:
        """A scene of `count` tool-call requests (2–5 declared tools) whose free-text argument
        values are random strings: the copy of the drills, inside the call format. With
        `shared`, every value of the scene is drawn from a few tokens (SHARED_PIECES) and may
        repeat one of them; with `respelt`, every value starts with a `respelt_firsts` token
        (none if the vocabulary has no such token)."""
        kind = "span" if shared else "respelt" if respelt else "random"
        rng = random.Random(f"{self.seed}:{kind}-call:{index}")
        strings = (self._shared_strings(rng) if shared
                   else self._respelt_string if respelt else self._string)
        generator = DialogGenerator(self.seed, False, strings=strings)
        specs = rng.sample(CATALOG, rng.randint(2, 5))
        tools = [tool_json(spec, rng, False) for spec in specs]
        chosen = [rng.randrange(len(specs))
                  for _ in range(0 if respelt and not self.respelt_firsts else count)]
        return Scene(rng.choice(SYSTEM_PROMPTS), tools,
                     [generator.call_example(rng, specs[k], tools[k]) for k in chosen])

    def _request(self, rng: random.Random, repeats: bool = False, slash_share: float = 0.0
                 ) -> tuple[str, str]:
        while True:
            ids = self._ids(rng, self.firsts, self.pieces, repeats)
            if slash_share and self.slash_pieces:
                ids[1:] = [rng.choice(self.slash_pieces) if rng.random() < slash_share else i
                           for i in ids[1:]]
            value = self.encoder.tokenizer.decode(ids)[1:]
            user = rng.choice(REPEAT_PROMPTS).format(value=value)
            if contains_run(self.encoder.encode(user), ids):
                return user, value

    @staticmethod
    def _ids(rng: random.Random, firsts: list[int], pieces: list[int], repeats: bool = False
             ) -> list[int]:
        ids = [rng.choice(firsts)] + [rng.choice(pieces)
                                      for _ in range(rng.randint(MIN_TOKENS, MAX_TOKENS) - 1)]
        if repeats and len(ids) >= 3:
            later = rng.randrange(2, len(ids))
            ids[later] = ids[rng.randrange(1, later)]
        return ids

    def _string(self, rng: random.Random) -> str:
        """A random string for a call's argument (a request template may tokenize it otherwise:
        then its completion copies canonical tokens, encode.py)."""
        return self.encoder.tokenizer.decode(self._ids(rng, self.firsts, self.pieces))[1:]

    def _respelt_string(self, rng: random.Random) -> str:
        """A random string whose first token, after a space in a request, is a `respelt_firsts`
        token (the pieces after it may not merge with it)."""
        while True:
            ids = self._ids(rng, self.respelt_firsts, self.pieces)
            text = self.encoder.tokenizer.decode(ids)
            if self.encoder.encode(text)[0] == ids[0]:
                return text[1:]

    def _shared_strings(self, rng: random.Random) -> Callable[[random.Random], str]:
        """A maker of random strings over a few tokens drawn once with `rng` (for one scene)."""
        firsts = rng.sample(self.firsts, 2)
        pieces = firsts + rng.sample(self.pieces, rng.choice(SHARED_PIECES))

        def shared_string(draw: random.Random) -> str:
            ids = self._ids(draw, firsts, pieces, repeats=draw.random() < 0.5)
            return self.encoder.tokenizer.decode(ids)[1:]
        return shared_string


def _spelt_within(encoder: SceneEncoder, text: str, trained: set[int]) -> bool:
    """Whether `text` (no leading space) encodes to 2+ tokens, all of them in `trained`."""
    ids = encoder.encode(text)
    return len(ids) >= 2 and set(ids) <= trained


def _word_like(text: str) -> bool:
    return text.isascii() and text.isalnum()

