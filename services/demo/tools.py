"""The tool catalog of the demo data: schemas, request phrasings (training / held-out), results.

A request template names the parameters it sets with `{param}` placeholders; the expected arguments
are exactly those parameters, in schema order. Enum and boolean parameters are set through phrases
(`"value": "train phrase/another|held-out phrase"`), every other parameter through its value maker
(`values.MAKERS`, `int:LO:HI`, `num:LO:HI`, `list:MAKER`). Held-out templates and phrases never occur
in training; they put the words a request is recognised by (weather, run, search, remind …) into
sentences of their own — a tiny model cannot learn synonyms it never saw.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Param:
    name: str
    schema: dict
    maker: str
    phrases: dict[str, str] = field(default_factory=dict)

    def phrase_options(self, value: str, held_out: bool) -> list[str]:
        train, _, held = self.phrases[value].partition("|")
        return (held if held_out else train).split("/")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: tuple[Param, ...]
    required: tuple[str, ...]
    train: tuple[str, ...]
    held_out: tuple[str, ...]
    result: str
    answer: str


def _str(name: str, maker: str, **schema) -> Param:
    return Param(name, {"type": "string", **schema}, maker)


def _enum(name: str, phrases: dict[str, str]) -> Param:
    return Param(name, {"type": "string", "enum": list(phrases)}, "enum", phrases)


def _bool(name: str, true: str, false: str) -> Param:
    return Param(name, {"type": "boolean"}, "bool", {"true": true, "false": false})


CATALOG: tuple[ToolSpec, ...] = (
    ToolSpec(
        "get_weather", "Current weather of a city",
        (_str("city", "city"), Param("days", {"type": "integer", "minimum": 1, "maximum": 14}, "int:1:14"),
         _enum("unit", {"celsius": "in celsius/in Celsius/in degrees Celsius|using celsius",
                        "fahrenheit": "in fahrenheit/in Fahrenheit|using fahrenheit"})),
        ("city",),
        ("What is the weather in {city}?", "Weather in {city} for {days} days?",
         "How is the weather in {city} {unit}?", "Give me the forecast for {city} for {days} days {unit}.",
         "Is it raining in {city}?", "Weather in {city}, please.", "Forecast for {city}, next {days} days.",
         "Tell me the weather in {city} {unit}.", "What will the weather be in {city} for the next {days} days?"),
        ("Could you check the weather for {city} over {days} days?", "I need the forecast for {city} {unit}.",
         "Please tell me the weather in {city} today.", "How will the weather look in {city} {unit} over {days} days?"),
        "{condition}, {temperature}", "It is {result} in {city}."),
    ToolSpec(
        "shell", "Run a shell command",
        (_str("command", "command"), Param("timeout_s", {"type": "number", "minimum": 0, "maximum": 600},
                                           "int:5:120"),
         _str("cwd", "directory")),
        ("command",),
        ("Run {command}", "Please run `{command}`.", "Execute {command} in {cwd}.",
         "Run `{command}` with a timeout of {timeout_s} seconds.", "In {cwd}, run {command}",
         "Can you run {command} for me?", "Execute `{command}`."),
        ("Could you execute `{command}` inside {cwd}?", "Go ahead and run {command}, allowing {timeout_s} seconds.",
         "Please run the command `{command}` now."),
        "{output}", "The command finished: {result}"),
    ToolSpec(
        "search_web", "Web search",
        (_str("query", "words"), Param("top_k", {"type": "integer", "minimum": 1, "maximum": 20}, "int:1:20"),
         _bool("safe", "with safe search/with safe search on|and turn safe search on",
               "without safe search/with safe search off|and turn safe search off")),
        ("query",),
        ("Search the web for {query}.", "Search for \"{query}\" and give me {top_k} results.",
         "Look up {query} online {safe}.", "Find {top_k} pages about {query}.", "Google {query} {safe}."),
        ("Could you search online for {query}? I want {top_k} results.", "Please look up {query} {safe}.",
         "Do a web search about {query}."),
        "Top result: {query} explained", "I found: {result}."),
    ToolSpec(
        "read_file", "Read a file",
        (_str("path", "path"), Param("offset", {"type": "integer", "minimum": 0}, "int:0:500"),
         Param("limit", {"type": "integer", "minimum": 1, "maximum": 2000}, "int:1:200")),
        ("path",),
        ("Read {path}.", "Show me the contents of {path}.", "Open {path} and read {limit} lines.",
         "Read {path} starting at line {offset}.", "Print {path} from line {offset}, {limit} lines.",
         "What is in {path}?"),
        ("Could you read the file {path}?", "Please open {path} and read {limit} lines from line {offset}."),
        "{sentence}", "The file says: {result}."),
    ToolSpec(
        "write_file", "Write a file",
        (_str("path", "path"), _str("content", "sentence")),
        ("path", "content"),
        ("Write \"{content}\" to {path}.", "Save the text \"{content}\" in {path}.",
         "Create {path} containing \"{content}\"."),
        ("Please save \"{content}\" into the file {path}.",),
        "ok", "Saved {path}."),
    ToolSpec(
        "list_files", "List a directory",
        (_str("path", "directory"),
         _bool("hidden", "including hidden files/with hidden files|and the hidden files too",
               "without hidden files/skipping hidden files|but skip hidden files")),
        ("path",),
        ("List the files in {path}.", "What files are in {path}?", "List {path} {hidden}.",
         "Show the directory {path} {hidden}."),
        ("Could you list everything in {path} {hidden}?", "Which files are there in the directory {path}?"),
        "{file_name}", "The directory contains {result}."),
    ToolSpec(
        "create_event", "Calendar event",
        (_str("title", "title"), _str("date", "date"), _str("time", "clock_time"),
         Param("duration_minutes", {"type": "integer", "minimum": 5, "maximum": 480}, "int:15:120"),
         Param("attendees", {"type": "array", "items": {"type": "string"}}, "list:person")),
        ("title", "date"),
        ("Schedule \"{title}\" on {date}.", "Add {title} to my calendar on {date} at {time}.",
         "Create an event \"{title}\" on {date} at {time} for {duration_minutes} minutes.",
         "Book {title} on {date} with {attendees}.",
         "Set up a meeting \"{title}\" on {date} at {time} with {attendees}."),
        ("Please schedule \"{title}\" for {date} at {time} and invite {attendees}.",
         "Put a {duration_minutes} minute event \"{title}\" on my calendar on {date}.",
         "I need an event called \"{title}\" on {date}."),
        "created", "The event {title} is on your calendar."),
    ToolSpec(
        "send_email", "Send an email",
        (Param("to", {"type": "array", "items": {"type": "string"}}, "list:email"),
         _str("subject", "title"), _str("body", "sentence")),
        ("to", "subject"),
        ("Email {to} about {subject}.", "Send an email to {to} with the subject \"{subject}\".",
         "Write to {to}: subject \"{subject}\", body \"{body}\"."),
        ("Please email {to} with the subject \"{subject}\" and the body \"{body}\".",
         "Could you send an email to {to} regarding \"{subject}\"?"),
        "sent", "The email to {to} is sent."),
    ToolSpec(
        "set_reminder", "Reminders",
        (_str("text", "words"), _str("at", "clock_time"),
         _enum("repeat", {"never": "once/just once|only once", "daily": "every day/daily|every single day",
                          "weekly": "every week/weekly|every single week"})),
        ("text", "at"),
        ("Remind me to {text} at {at}.", "Set a reminder at {at} to {text} {repeat}.",
         "At {at}, remind me about {text}."),
        ("Please remind me about {text} at {at} {repeat}.", "Could you set a reminder to {text} at {at}?"),
        "scheduled", "I will remind you at {at}."),
    ToolSpec(
        "translate", "Translate text",
        (_str("text", "sentence"),
         _enum("target_lang", {"fr": "French|into French", "de": "German|into German",
                               "es": "Spanish|into Spanish", "ja": "Japanese|into Japanese"})),
        ("text", "target_lang"),
        ("Translate \"{text}\" to {target_lang}.", "How do you say \"{text}\" in {target_lang}?",
         "Say \"{text}\" in {target_lang}."),
        ("Could you translate \"{text}\" {target_lang} for me?",),
        "{text} (translated)", "The translation is: {result}."),
    ToolSpec(
        "get_stock_price", "Finance",
        (_str("ticker", "ticker"),
         _enum("exchange", {"NASDAQ": "on NASDAQ/on the NASDAQ|listed at NASDAQ",
                            "NYSE": "on NYSE/on the NYSE|listed at NYSE"})),
        ("ticker",),
        ("What is the stock price of {ticker}?", "Quote {ticker} {exchange}.", "How is {ticker} trading?"),
        ("Could you get the stock price of {ticker} {exchange}?", "I need the latest stock price for {ticker}."),
        "{price} USD", "{ticker} trades at {result}."),
    ToolSpec(
        "set_thermostat", "Thermostat",
        (Param("temperature", {"type": "number", "minimum": 10, "maximum": 30}, "num:16:28"),
         _enum("mode", {"heat": "in heat mode/to heat|in heat setting", "cool": "in cool mode/to cool|in cool setting",
                        "auto": "in auto mode/automatically|in auto setting"})),
        ("temperature",),
        ("Set the thermostat to {temperature} degrees.", "Heat the house to {temperature} {mode}.",
         "Thermostat {temperature}, {mode}."),
        ("Please set the thermostat at {temperature} degrees {mode}.",
         "Could you change the thermostat to {temperature} degrees?"),
        "ok", "The thermostat is set to {temperature} degrees."),
)

BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in CATALOG}

# Shell requests in plain words, mapped to the command an operator would type. The held-out
# phrasings ask for the same commands in words never used in training.
SHELL_INTENTS: tuple[tuple[str, str, str], ...] = (
    ("pwd", "Show the current directory./Where am I in the file system?/Print the working directory.",
     "Could you print the current directory?"),
    ("ls", "List the files here./Show the files in this directory.", "Please list the files here."),
    ("whoami", "Who am I logged in as?/Show my user name.", "Please show my user name."),
    ("df -h", "Show disk usage./How much disk space is free?", "Could you show the disk usage?"),
    ("date", "What is the date on the server?/Show the system date.", "Please show the system date."),
    ("uptime", "How long has the machine been up?/Show the uptime.", "Could you show the uptime?"),
    ("ps aux", "Show running processes./List the processes.", "Please list the running processes."),
)
