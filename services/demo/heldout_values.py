"""Which copied training values the held-out set's argument values keep out of the training stream.

After the first phase every value is drawn anew (fresh_values.py), so the trainer checks each
copied value against the values of the held-out prompts. By default a copied value is refused when
it contains a held-out value anywhere (`"/srv/data/x"` holds the held-out directory `/srv/data`).

That rule is too wide for a held-out value that is one word of the shared word pool (lists.py),
such as the held-out reminder text `door`. Held-out free-text values are meant to be training
words in combinations training never uses; a one-word value is such a combination of one word.
Refusing every value that contains it keeps the word itself from ever being copied after the
first phase. The guard's 200 held-out prompts hold two such values, `door` and `Dashboard`, and
run R (step 4100), trained 3,400 steps without copying either word, wrote `Da` for "door" in
every run (docs/demo-model.md, "The committed model"). With `pool_words_whole`, such a value is
refused only as the whole value; every other held-out value (names, paths, multi-word text) still
may not occur inside one.
"""
from __future__ import annotations

from typing import Collection, Iterable

from services.demo.lists import pool


class HeldOutValues:
    def __init__(self, values: Collection[str], pool_words_whole: bool):
        words = {w.lower() for w in pool("word", False)}
        whole = {v for v in values if pool_words_whole and v.lower() in words}
        self.whole = frozenset(whole)                 # refused only as the whole value
        self.anywhere = frozenset(set(values) - whole)  # refused inside any value

    def refuses(self, copied: Iterable[str]) -> bool:
        """Whether any of an example's copied values holds a held-out value."""
        return any(value in self.whole or any(held in value for held in self.anywhere)
                   for value in copied)
