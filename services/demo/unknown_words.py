"""Words outside the trained vocabulary, put into training requests so that the model reads past them.

A user types words the demo model never learnt ("list everything in …", "the latest stock price
for …"): their tokens have no trained row, and unless they are another spelling of a trained word
(standins.py) their embedding is the mean of the trained rows (export.py), an input the model never
saw while training. The step-3900 model copied "ZM" right
from "I need the stock price for ZM." and wrong ("Z") from "I need the latest stock price for
ZM." — only the untrained " latest" differs. With `share` > 0, that share of a step's call
examples gets 1–2 such words inserted before words of its request (not before the first: its
token has no leading space), never inside a copied value or next to one (where an unquoted
value's boundary would become a guess); the target call is unchanged, so the model learns that
an unknown word changes nothing.

The words are the untrained whole-word tokens of the V4 vocabulary (a leading space, 3+ ASCII
letters) without a stand-in (standins.py: those read as a trained spelling of the same word, which
may change the call): all of them embed as the mean row, but the hash-routed layer sends each to its own
experts, as serving does.
"""
from __future__ import annotations

import random

from services.demo.encode import SPACE, EncodedExample, EncodedScene, SceneEncoder
from services.demo.standins import stand_ins
from services.demo.vocab import TrainedVocab
from services.frontend.dsv4_tokens import ASSISTANT, USER

MIN_WORD_CHARS = 3


class UnknownWords:
    def __init__(self, vocab: TrainedVocab, encoder: SceneEncoder, seed: int, share: float):
        self.encoder = encoder
        self.seed = seed
        self.share = share
        tokenizer = encoder.tokenizer
        self.user_id = tokenizer.token_to_id(USER)
        self.assistant_id = tokenizer.token_to_id(ASSISTANT)
        readable = stand_ins(tuple(vocab.ids.tolist()))
        self.pool = [i for i in vocab.outside(list(range(tokenizer.get_vocab_size())))
                     if _is_word(tokenizer.id_to_token(i)) and i not in readable]

    def scenes(self, scenes: list[EncodedScene], index: int) -> list[EncodedScene]:
        """Step `index`'s scenes with unknown words in `share` of their call examples."""
        rng = random.Random(f"{self.seed}:unknown-words:{index}")
        return [EncodedScene(scene.prefix_ids,
                             [self.example(e, rng) if e.example.kind == "call"
                              and rng.random() < self.share else e for e in scene.examples],
                             scene.scene) for scene in scenes]

    def example(self, encoded: EncodedExample, rng: random.Random) -> EncodedExample:
        """The example with 1–2 unknown tokens inserted into its last user message."""
        prompt = list(encoded.prompt_ids)
        starts = self.insert_positions(prompt, encoded.example.copy_values)
        for position in sorted(rng.sample(starts, min(len(starts), rng.randint(1, 2))),
                               reverse=True):
            prompt.insert(position, rng.choice(self.pool))
        return EncodedExample(prompt, encoded.completion_ids, encoded.example, encoded.key_tokens)

    def insert_positions(self, prompt_ids: list[int], values: list[str]) -> list[int]:
        """Indices before which a word may go: the last user message's tokens that start a word
        after a space, except in a copied value or right after one."""
        first = len(prompt_ids) - prompt_ids[::-1].index(self.user_id)
        end = prompt_ids.index(self.assistant_id, first)
        message = prompt_ids[first:end]
        text = self.encoder.tokenizer.decode(message, skip_special_tokens=False)
        taken = {n for occurrence in self.encoder.value_tokens(message, text, values)
                 for n in occurrence}
        tokens = [self.encoder.tokenizer.id_to_token(i) for i in message]
        return [first + n for n, token in enumerate(tokens)
                if token.startswith(SPACE) and n not in taken and n - 1 not in taken]


def _is_word(token: str) -> bool:
    word = token.removeprefix(SPACE)
    return (token.startswith(SPACE) and len(word) >= MIN_WORD_CHARS and word.isascii()
            and word.isalpha())
