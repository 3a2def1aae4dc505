"""Conversational frames around a training request template: "Could you …?", "Please … for me.".

The templates of tools.py are bare commands and questions ("Search the web for {query}."), while
people ask politely and indirectly; a tiny model that never saw a frame takes its words for the
request's (the step-825 model of the fresh phase read "Do a web search about …" as `shell` and
"Please remind me about …" as `set_thermostat`). A framed template never equals a held-out one:
`framed` falls back to the bare template then.
"""
from __future__ import annotations

import random
from typing import Collection

# First words of templates that are commands: they take the imperative frames.
VERBS = frozenset("Run Execute Search Look Find Google Read Show Open Print Write Save Create List "
                  "Schedule Add Book Set Email Send Remind Translate Say Quote Heat Give Tell "
                  # first words of composed templates only (composed.py)
                  "Check Get Fetch Report Start Launch Invoke Kick Use Type Do Query Display Load "
                  "Dump View Put Store Fill Overwrite Record Browse Enumerate Make Plan Block Mail "
                  "Drop Compose Ping Alert Nudge Render Convert Adjust Turn Keep Change".split())
IMPERATIVE = ("Could you {v}?", "Can you {v}?", "Would you {v}?", "Please {v}.",
              "Please {v} for me.", "I'd like you to {v}.", "I need you to {v}.", "Kindly {v}.",
              "{V}, please.", "{V} now.", "Hey, {v}.", "Go and {v}.")
OTHER = ("Hi! {t}", "Hello, {t}", "Quick question: {t}", "{t} Thanks.", "Hey, {t}", "{t} Thank you!")


def framed(template: str, rng: random.Random, avoid: Collection[str]) -> str:
    """`template` inside a frame drawn with `rng`, unless the result is one of `avoid`."""
    if template.split(" ", 1)[0].strip(",") in VERBS:
        body = template.rstrip(".?")
        result = rng.choice(IMPERATIVE).format(v=body[0].lower() + body[1:], V=body)
    else:
        result = rng.choice(OTHER).format(t=template)
    return template if result in avoid else result
