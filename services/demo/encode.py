"""Scenes → token ids: the gateway's own rendering, the real V4 tokenizer, a loss mask.

The prompt is exactly what the frontend renders (`render_chat_request`) and tokenizes. The
completion is the text the frontend would render for the target assistant turn (prompt + target
minus prompt). Its tokenization follows the prompt where the completion copies a value: a value is
tokenized as it appears in the prompt (the first token's leading space dropped after `">` or a
quote), so that copying is a token-for-token operation. The completion's text is unchanged — the
grammar and the parser see the same characters either way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from tokenizers import Tokenizer

from services.demo.scene import Example, Scene
from services.frontend.chat_format import render_chat_request
from services.frontend.tokenizer import TOKENIZER_FILE, bundled_tokenizer_dir

SPACE = "Ġ"  # the byte-level alphabet's space


@dataclass(frozen=True)
class EncodedExample:
    prompt_ids: list[int]
    completion_ids: list[int]
    example: Example
    key_tokens: list[bool]     # per completion token: part of a copied value or the called tool's
    #                            name, or the token that closes a copied value (see `key_tokens`)


@dataclass(frozen=True)
class EncodedScene:
    prefix_ids: list[int]      # BOS + system prompt (tools included): shared by every example
    examples: list[EncodedExample]
    scene: Scene


class SceneEncoder:
    def __init__(self, no_lone_s: bool = False) -> None:
        """With `no_lone_s`, a copied value the prompt does not spell bare never starts with the
        piece `s` (see `unspaced_value`)."""
        self.tokenizer = Tokenizer.from_file(str(bundled_tokenizer_dir() / TOKENIZER_FILE))
        self.lone_s = self.tokenizer.token_to_id("s") if no_lone_s else None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def scene(self, scene: Scene) -> EncodedScene:
        # BOS + the system turn (tools included); an absent system message renders as "".
        prefix_ids = self.encode(render_chat_request(
            {"messages": [{"role": "system", "content": scene.system or ""}], "tools": scene.tools}
        ).text)
        encoded = [self.example(scene.request(example), example) for example in scene.examples]
        for item in encoded:
            if item.prompt_ids[:len(prefix_ids)] != prefix_ids:
                raise AssertionError("a scene's prompts must all start with its system prefix")
        return EncodedScene(prefix_ids, encoded, scene)

    def example(self, request: dict[str, Any], example: Example) -> EncodedExample:
        prompt = render_chat_request(request).text
        full = render_chat_request({**request, "messages": request["messages"] + [example.target]}
                                   ).text
        if not full.startswith(prompt):
            raise AssertionError("the rendered turn must extend the rendered prompt")
        prompt_ids = self.encode(prompt)
        text = full[len(prompt):]
        completion = self.completion_ids(text, example.copy_values, prompt_ids)
        keys = self.key_tokens(completion, _spans(text, _call_texts(example)),
                               _spans(text, example.copy_values))
        return EncodedExample(prompt_ids, completion, example, keys)

    def key_tokens(self, ids: list[int], spans: list[tuple[int, int]],
                   closed: list[tuple[int, int]]) -> list[bool]:
        """Tokens overlapping a span, and the first token after each span of `closed`: the tokens
        an exact call depends on (a value's first token is found in the request, the rest copied,
        and the copy must stop) — the copy phase weights them up in the loss."""
        starts, ends = self.token_offsets(ids)
        keys = [any(a < end and start < b for a, b in spans) for start, end in zip(starts, ends)]
        for _, b in closed:
            after = next((n for n, start in enumerate(starts) if start >= b), None)
            if after is not None:
                keys[after] = True
        return keys

    def token_offsets(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """Start and end character offsets of every token in the text `ids` spell."""
        ends = [len(self.tokenizer.decode(ids[:n + 1], skip_special_tokens=False))
                for n in range(len(ids))]
        return [0] + ends[:-1], ends

    def value_tokens(self, ids: list[int], text: str, values: list[str]) -> list[list[int]]:
        """Per occurrence of a value in `text` (spelled by `ids`): the indices of its tokens."""
        starts, ends = self.token_offsets(ids)
        return [[n for n, (start, end) in enumerate(zip(starts, ends)) if a < end and start < b]
                for a, b in _spans(text, values)]

    def completion_ids(self, text: str, copied: Iterable[str], prompt_ids: list[int]) -> list[int]:
        """Tokens of `text`, copied values segmented as in the prompt (canonical elsewhere)."""
        spans = _spans(text, sorted(set(v for v in copied if v), key=len, reverse=True))
        ids: list[int] = []
        cursor = 0
        for start, end in spans:
            spaced = start > 0 and text[start - 1] == " "
            ids += self.encode(text[cursor:start - spaced])
            ids += self._copied(text[start - spaced:end], spaced, prompt_ids)
            cursor = end
        ids += self.encode(text[cursor:])
        if self.tokenizer.decode(ids, skip_special_tokens=False) != text:
            raise AssertionError(f"completion tokens do not spell the completion: {text!r}")
        return ids

    def _copied(self, value: str, spaced: bool, prompt_ids: list[int]) -> list[int]:
        """The value's tokens as they occur in the prompt, or its canonical tokens."""
        if spaced:
            return self.encode(value)
        bare = self.encode(value)
        if contains_run(prompt_ids, bare):
            return bare
        spaced_ids = self.encode(" " + value)
        if contains_run(prompt_ids, spaced_ids):
            return self._first_made_bare(spaced_ids, value)
        return self.unspaced_value(value)

    def call_spelling(self, value: str) -> list[int]:
        """The value's tokens after `">` or a quote when the request spells it after a space: the
        request's tokens with the first one bare, or `unspaced_value` when that has no bare twin."""
        return self._first_made_bare(self.encode(" " + value), value)

    def _first_made_bare(self, spaced_ids: list[int], value: str) -> list[int]:
        first = self.tokenizer.id_to_token(spaced_ids[0])
        stripped = self.tokenizer.token_to_id(first[1:]) if first.startswith(SPACE) else None
        if stripped is None:
            return self.unspaced_value(value)
        return [stripped] + spaced_ids[1:]

    def unspaced_value(self, value: str) -> list[int]:
        """The value's tokens after `">` or a quote when the prompt does not give them: its own;
        with `no_lone_s`, a value whose own tokens start with the piece `s` (soup is `s`+`oup`)
        is spelt from its shortest first piece of 2+ letters instead (`so`+`up`). `s` ends a plural far more often
        than it starts a value, and every run since run R wrote the letter starts' s-words wrong
        at a value's start (docs/demo-model.md)."""
        bare = self.encode(value)
        if self.lone_s is None or bare[:1] != [self.lone_s]:
            return bare
        for length in range(2, len(value.split(" ")[0])):
            first = self.tokenizer.token_to_id(value[:length])
            if first is not None:
                return [first] + self.encode(value[length:])
        return bare


def _call_texts(example: Example) -> list[str]:
    """The copied values, and the called tool's name and argument values as the call spells them."""
    texts = list(example.copy_values)
    if example.expected_call:
        name, args = example.expected_call
        texts.append(name)
        for value in args.values():
            texts.extend(v if isinstance(v, str) else json.dumps(v)
                         for v in (value if isinstance(value, list) else [value]))
    return [t for t in texts if t]


def _spans(text: str, values: list[str]) -> list[tuple[int, int]]:
    """Non-overlapping (start, end) occurrences of the values in text, longest values first."""
    taken: list[tuple[int, int]] = []
    for value in values:
        start = text.find(value)
        while start >= 0:
            end = start + len(value)
            if all(end <= a or start >= b for a, b in taken):
                taken.append((start, end))
            start = text.find(value, end)
    return sorted(taken)


def contains_run(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))
