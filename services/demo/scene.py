"""What a training step learns from: a `Scene` (one system prompt and its declared tools) shared
by several `Example`s, each the conversation before one assistant turn and that turn
(dialogs.py draws them)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Example:
    kind: str                          # "call", "answer" or "chat"
    messages: list[dict[str, Any]]     # the conversation before the turn to predict (no system)
    target: dict[str, Any]             # the assistant message to predict
    thinking: bool
    copy_values: list[str] = field(default_factory=list)   # strings copied from the prompt
    expected_call: Optional[tuple[str, dict[str, Any]]] = None
    # Free-form argument values (not enum members, not a command named by its intent): the ones a
    # held-out example must never share with training.
    novel_values: list[str] = field(default_factory=list)


@dataclass
class Scene:
    system: Optional[str]
    tools: list[dict[str, Any]]
    examples: list[Example]

    def request(self, example: Example) -> dict[str, Any]:
        """The OpenAI request whose rendered prompt precedes `example.target`."""
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        body: dict[str, Any] = {"messages": system + example.messages,
                                "chat_template_kwargs": {"thinking": example.thinking}}
        if self.tools:
            body["tools"] = self.tools
        return body
