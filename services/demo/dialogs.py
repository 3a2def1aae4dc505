"""Seeded synthetic conversations: scenes of 2–5 declared tools and the turns to learn in them.

A `Scene` (scene.py) is one system prompt (tools included) shared by several `Example`s: a tool
call chosen by the request, with arguments copied out of the user message; an answer from a tool
result in the next turn; a greeting or a short fixed answer. Each example is in chat or thinking
mode (thinking adds a short reasoning span). Everything is drawn from one `random.Random`, so a
scene is a pure function of (seed, index); `held_out` draws from the held-out templates and lists
only.
"""
from __future__ import annotations

import json
import random
from typing import Any, Callable, Optional

from services.demo import fresh_values, phrasing, values
from services.demo.composed import Composer, ValuePhrases
from services.demo.scene import Example, Scene
from services.demo.call_text import (call_reasoning, placeholders, string_values, surface_of,
                                     tool_json)
from services.demo.tools import CATALOG, SHELL_INTENTS, Param, ToolSpec

CHAT_EVERY = 6               # every 6th training scene is chat-only (no tools declared)
DRILLS_PER_STEP = 16         # short copy drills learnt beside every training scene
FRAMED_SHARE = 0.6           # of call requests in a frame, when frames are on
REDRAWS = 20                 # draws of a value `accepts` refuses before it is kept anyway
REPEAT_PROMPTS = ("Repeat after me: {value}", "Say \"{value}\".", "Please repeat this: {value}",
                  "Echo: {value}", "Copy this exactly: {value}")
DRILL_VALUES = ("words", "city", "full_name", "path", "email", "command", "title", "date")
SYSTEM_PROMPTS = (None, None, "You are terse.", "You are a helpful assistant.",
                  "You are a helpful assistant with access to tools.")
CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy")
CHAT: tuple[tuple[str, str], ...] = (
    ("Hello!/Hi!/Hey there./Good morning!/Hello", "Hello! How can I help you today?"),
    ("Say hello./Please say hello.", "Hello!"),
    ("Who are you?/What is your name?", "I am a tiny DeepSeek-V4 demo model served by dsv4serve."),
    ("Thank you!/Thanks!/Thanks a lot.", "You're welcome!"),
    ("Goodbye!/Bye!/See you later.", "Goodbye! Have a nice day."),
    ("How are you?/How are you doing?", "I am fine, thank you. How can I help?"),
    ("What can you do?/Help", "I can chat briefly and call the tools you declare: weather, shell, "
                              "calendar, files, search and more."),
    ("What is the capital of France?", "Paris."),
    ("What is 2+2?/Think about 2+2.", "4."),
    ("Tell me a joke.", "I would, but my weights are too tiny to be funny."),
)


class DialogGenerator:
    """Scenes and examples of one split (training or held-out), seeded."""

    def __init__(self, seed: int, held_out: bool, thinking_share: float = 0.3,
                 strings: Optional[Callable[[random.Random], str]] = None, fresh: bool = False,
                 accepts: Optional[Callable[[str], bool]] = None, frames: bool = False,
                 long_values: bool = False, composed_share: float = 0.0,
                 composer: Optional[Composer] = None, path_parts: bool = False,
                 listed_names: float = 0.0, short_options: bool = False,
                 slash_ends: bool = False, letter_starts: bool = False,
                 s_starts: float = 0.0):
        """`strings`, if given, draws every free-text argument value (in place of the lists);
        `fresh` draws every value anew (fresh_values.py: training only) instead of from lists;
        `accepts`, if given, redraws a value it refuses (up to REDRAWS times: e.g. one whose
        tokens the trained vocabulary lacks); `frames` puts FRAMED_SHARE of the call requests in
        a conversational frame (phrasing.py); `long_values` (with `fresh`) draws free-text values
        of more words (`fresh_values.LONG_MAKERS`); `composed_share` of the call requests use a
        composed template (composed.py: training only) from `composer` (the narrow parts if
        None); `path_parts` (with `fresh`) builds paths from the
        training lists' directory names and file stems too (`fresh_values.with_path_parts`);
        `listed_names` (with `fresh`) is the share of city and person names drawn from the
        training lists (`fresh_values.with_listed_names`); `short_options` (with `fresh`) gives a
        share of commands short options (`fresh_values.with_short_options`); `slash_ends` (with
        `fresh`) ends a share of directories and paths with a slash-merged piece
        (`fresh_values.with_slash_ends`); `letter_starts` (with `fresh`) starts a share of
        free-text values with a word spelt from a one-letter piece
        (`fresh_values.with_letter_starts`), `s_starts` of those words spelt from `s`."""
        if fresh and held_out:
            raise ValueError("fresh values are training values")
        if composed_share and held_out:
            raise ValueError("composed templates are training templates")
        self.seed = seed
        self.held_out = held_out
        self.thinking_share = thinking_share
        self.strings = strings
        if (long_values or path_parts or listed_names or short_options or slash_ends
                or letter_starts) and not fresh:
            raise ValueError("long values, path parts, listed names, short options, slash "
                             "ends and letter starts are fresh values")
        self.makers = (fresh_values.LONG_MAKERS if long_values else
                       fresh_values.MAKERS if fresh else values.MAKERS)
        if path_parts:
            self.makers = fresh_values.with_path_parts(self.makers)
        if listed_names:
            self.makers = fresh_values.with_listed_names(self.makers, listed_names)
        if short_options:
            self.makers = fresh_values.with_short_options(self.makers)
        if slash_ends:
            self.makers = fresh_values.with_slash_ends(self.makers)
        if s_starts and not letter_starts:
            raise ValueError("s starts are a share of the letter starts")
        if letter_starts:
            self.makers = fresh_values.with_letter_starts(self.makers, s_starts)
        self.drill_chain = fresh_values.drill_chain if fresh else values.drill_chain
        self.accepts = accepts
        self.frames = frames
        self.composed_share = composed_share
        self.composer = (composer or Composer()) if composed_share else None

    def training_scenes(self, index: int, examples: int, long_drills: int = 0) -> list[Scene]:
        """What training step `index` learns from: scene `index` of the stream (chat-only every
        CHAT_EVERY-th), a scene of short copy drills and, if asked, one of `long_drills`."""
        scenes = [self.scene(index, examples, chat_only=index % CHAT_EVERY == CHAT_EVERY - 1),
                  self.drill_scene(index)]
        return scenes + ([self.drill_scene(index, long_drills)] if long_drills else [])

    def drill_scene(self, index: int, long_drills: int = 0) -> Scene:
        """No tools: "Repeat after me: …" answered by the value itself. Cheap (no tool list to
        read) and the same token-for-token copying a call's arguments need. `long_drills` asks
        for that many drills of values no list holds (`values.drill_chain`): only a copy of the
        prompt's tokens gets them right, where a listed name can also be recalled."""
        if long_drills:
            rng = random.Random(f"{self.seed}:{self.held_out}:long-drill:{index}")
            makes = [lambda: self._draw(self.drill_chain, rng)] * long_drills
        else:
            rng = random.Random(f"{self.seed}:{self.held_out}:drill:{index}")
            makes = [lambda: self._draw(self.makers[rng.choice(DRILL_VALUES)], rng)
                     ] * DRILLS_PER_STEP
        return self._drills(rng, makes)

    def listed_drill_scene(self, index: int, count: int) -> Scene:
        """`count` drills of the training lists' real names (`fresh_values.listed_name`): a name
        the request says as one spaced token (" Madrid") is answered in other pieces
        ("Mad"+"rid"), which only a name-by-name spelling learnt in training gets right."""
        rng = random.Random(f"{self.seed}:{self.held_out}:listed-drill:{index}")
        return self._drills(rng, [lambda: self._draw(fresh_values.listed_name, rng)] * count)

    def _drills(self, rng: random.Random, makes: list[Callable[[], str]]) -> Scene:
        examples = []
        for make in makes:
            value = make()
            thinking = rng.random() < self.thinking_share
            target: dict[str, Any] = {"role": "assistant", "content": value}
            if thinking:
                target["reasoning_content"] = f"The user wants me to repeat {value}."
            user = rng.choice(REPEAT_PROMPTS).format(value=value)
            examples.append(Example("chat", [{"role": "user", "content": user}], target, thinking,
                                    [value]))
        return Scene(None, [], examples)

    def scene(self, index: int, examples: int, chat_only: bool = False) -> Scene:
        rng = random.Random(f"{self.seed}:{self.held_out}:{index}")
        system = rng.choice(SYSTEM_PROMPTS)
        if chat_only:
            return Scene(system, [], [self._chat(rng) for _ in range(examples)])
        specs = rng.sample(CATALOG, rng.randint(2, 5))
        tools = [tool_json(spec, rng, self.held_out) for spec in specs]
        return Scene(system, tools, [self._example(rng, specs, tools) for _ in range(examples)])

    def call_scene(self, index: int) -> Scene:
        """A scene with one tool-call request (the held-out evaluation's unit)."""
        rng = random.Random(f"{self.seed}:{self.held_out}:call:{index}")
        system = rng.choice(SYSTEM_PROMPTS)
        specs = rng.sample(CATALOG, rng.randint(2, 5))
        tools = [tool_json(spec, rng, self.held_out) for spec in specs]
        chosen = rng.randrange(len(specs))
        return Scene(system, tools, [self.call_example(rng, specs[chosen], tools[chosen])])

    def call_example(self, rng: random.Random, spec: ToolSpec, tool: dict[str, Any]) -> Example:
        """One request for `spec` answered by a call (arguments limited to the declared schema)."""
        declared = set(tool["function"]["parameters"]["properties"])
        if spec.name == "shell" and rng.random() < 0.3:
            command, train, held = rng.choice(SHELL_INTENTS)
            user = rng.choice((held if self.held_out else train).split("/"))
            args: dict[str, Any] = {"command": command}
            novel: list[str] = []
        else:
            template, phrases = self._template(rng, spec, declared)
            args, surfaces = self._fill(rng, spec, placeholders(template, spec), phrases)
            user = template.format(**surfaces)
            novel = string_values({p.name: args[p.name] for p in spec.params
                              if p.name in args and p.maker not in ("enum", "bool")})
        thinking = rng.random() < self.thinking_share
        call = {"id": f"call_{rng.randrange(16 ** 8):08x}", "type": "function",
                "function": {"name": spec.name, "arguments": json.dumps(args, ensure_ascii=False)}}
        target: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
        if thinking:
            target["reasoning_content"] = call_reasoning(spec, args)
        return Example("call", [{"role": "user", "content": user}], target, thinking,
                       string_values(args), (spec.name, args), novel)

    # ---- internals ----------------------------------------------------------------------------
    def _template(self, rng: random.Random, spec: ToolSpec, declared: set[str]
                  ) -> tuple[str, ValuePhrases]:
        """A request template and the enum and boolean phrases beyond the catalog's it may say
        its values with (a composed template's: composed.py)."""
        framed_share = FRAMED_SHARE if self.frames else 0.0
        if self.composer and rng.random() < self.composed_share:
            composed = self.composer.template(spec, rng, declared, framed_share)
            if composed is not None:
                return composed, self.composer.value_phrases(spec)
        templates = [t for t in (spec.held_out if self.held_out else spec.train)
                     if set(placeholders(t, spec)) <= declared]
        template = rng.choice(templates)
        if self.frames and rng.random() < FRAMED_SHARE:
            template = phrasing.framed(template, rng, spec.held_out)
        return template, {}

    def _example(self, rng: random.Random, specs: list[ToolSpec], tools: list[dict[str, Any]]
                 ) -> Example:
        roll = rng.random()
        if roll < 0.1:
            return self._chat(rng)
        index = rng.randrange(len(specs))
        call = self.call_example(rng, specs[index], tools[index])
        if roll < 0.3:
            return self._answer(rng, specs[index], call)
        return call

    def _answer(self, rng: random.Random, spec: ToolSpec, call: Example) -> Example:
        """The turn after the call: the tool's result comes back and the model answers from it."""
        _, args = call.expected_call
        fields = {**{k: surface_of(v) for k, v in args.items()}, **self._result_fields(rng, args)}
        result = spec.result.format(**fields)
        answer = spec.answer.format(result=result, **fields)
        history = dict(call.target)
        if rng.random() < 0.5:
            history.pop("reasoning_content", None)  # clients often drop earlier reasoning
        messages = call.messages + [history, {"role": "tool", "tool_call_id":
                                              call.target["tool_calls"][0]["id"], "content": result}]
        target: dict[str, Any] = {"role": "assistant", "content": answer}
        if call.thinking:
            target["reasoning_content"] = f"The tool returned {result}. I will answer."
        return Example("answer", messages, target, call.thinking,
                       call.copy_values + [result], None, call.novel_values)

    def _chat(self, rng: random.Random) -> Example:
        prompts, answer = rng.choice(CHAT)
        thinking = rng.random() < self.thinking_share
        target: dict[str, Any] = {"role": "assistant", "content": answer}
        if thinking:
            target["reasoning_content"] = "The user is chatting. I will reply briefly."
        user = rng.choice(prompts.split("/"))
        return Example("chat", [{"role": "user", "content": user}], target, thinking)

    def _fill(self, rng: random.Random, spec: ToolSpec, names: list[str],
              phrases: ValuePhrases) -> tuple[dict[str, Any], dict[str, str]]:
        args: dict[str, Any] = {}
        surfaces: dict[str, str] = {}
        for param in spec.params:
            if param.name in names:
                args[param.name], surfaces[param.name] = self._value(
                    rng, param, phrases.get(param.name, {}))
        return args, surfaces

    def _value(self, rng: random.Random, param: Param,
               phrases: dict[str, tuple[str, ...]]) -> tuple[Any, str]:
        kind, _, spec = param.maker.partition(":")
        if kind in ("enum", "bool"):
            choice = rng.choice(list(param.phrases))
            value: Any = {"true": True, "false": False}.get(choice, choice) if kind == "bool" else choice
            options = param.phrase_options(choice, self.held_out) + list(phrases.get(choice, ()))
            return value, rng.choice(options)
        if kind == "int":
            low, high = map(int, spec.split(":"))
            number = rng.randint(low, high)
            return number, str(number)
        if kind == "num":
            low, high = map(int, spec.split(":"))
            halves = rng.randint(low * 2, high * 2)
            number = halves // 2 if halves % 2 == 0 else halves / 2
            return number, str(number)
        if kind == "list":
            items = list(dict.fromkeys(self._text(rng, spec)
                                       for _ in range(rng.randint(1, 3))))
            return items, surface_of(items)
        text = self._text(rng, kind)
        return text, text

    def _text(self, rng: random.Random, kind: str) -> str:
        return self.strings(rng) if self.strings else self._draw(self.makers[kind], rng)

    def _draw(self, maker: Callable[[random.Random, bool], str], rng: random.Random) -> str:
        value = maker(rng, self.held_out)
        for _ in range(REDRAWS if self.accepts else 0):
            if self.accepts(value):
                break
            value = maker(rng, self.held_out)
        return value

    def _result_fields(self, rng: random.Random, args: dict[str, Any]) -> dict[str, str]:
        return {"condition": rng.choice(CONDITIONS), "temperature": f"{rng.randint(-5, 35)}C",
                "output": "/home/alice" if args.get("command") == "pwd" else "done",
                "price": f"{rng.randint(20, 900)}.{rng.randint(0, 99):02d}",
                "sentence": values.sentence(rng, self.held_out),
                "file_name": values.file_name(rng, self.held_out)}
