"""The wider composed parts (`train-demo --fresh-composed-wide`): more heads, slot phrases and
phrases for enum and boolean values, added to composed.PARTS.

The step-3200 model's misses on the held-out set (docs/demo-model.md) were mostly of kinds the
catalog's narrow phrasing invites: a number said before its noun ("a 5 day forecast") where
training only ever put it after ("for 5 days"), so the parameter was left out; an enum value said
in words training never used for it; a head that training only ever followed with one optional
parameter ("Tell me the weather in {city} {unit}"), so the model adds that parameter when the
request does not say it. These parts say every numeric parameter both ways, give every enum and
boolean value several more phrasings (a phrase of one value never contains another value's), and
use the catalog's heads with and without their optional parameters. They were written after
reading those misses; the held-out guard (composed.py) still refuses any template holding a
held-out 4-gram that training lacked, and no phrase here is, or contains, a held-out phrase
(tests/demo/test_composed.py checks both).
"""
from __future__ import annotations

# Heads may hold optional placeholders: the composer uses such a head only where the tool
# declares them.
WIDE_HEADS: dict[str, tuple[str, ...]] = {
    "get_weather": ("Tell me the weather in {city}", "Tell me the forecast for {city}",
                    "What's the weather like in {city}", "Show me the weather in {city}",
                    "Give me a {days} day forecast for {city}",
                    "Get the {days}-day forecast for {city}",
                    "Show a {days} day weather report for {city}"),
    "shell": ("Run {command} with a {timeout_s} second limit",
              "Give `{command}` a {timeout_s}s timeout",
              "Over in {cwd}, run `{command}`", "cd to {cwd} and run {command}"),
    "search_web": ("Get the top {top_k} results for {query}", "Show {top_k} hits for {query}",
                   "Search about {query}", "Do an online search for {query}",
                   "Look up {query} on the internet"),
    "read_file": ("Read the first {limit} lines of {path}", "Show {limit} lines of {path}",
                  "Read {path} from line {offset} on", "Open the file at {path}"),
    "list_files": ("What is inside {path}", "Show the contents of the folder {path}",
                   "List the folder {path}", "Tell me what files {path} holds"),
    "create_event": ("Add a {duration_minutes} minute meeting \"{title}\" on {date}",
                     "Book a {duration_minutes}-minute slot for \"{title}\" on {date}",
                     "Schedule a {duration_minutes} min session \"{title}\" for {date}",
                     "Set up \"{title}\" on {date} at {time}",
                     "Create a meeting called \"{title}\" for {date}",
                     "I want \"{title}\" on the calendar on {date}"),
    "send_email": ("Send an email about \"{subject}\" to {to}",
                   "Mail {to} with the title \"{subject}\""),
    "set_reminder": ("Set up a reminder for {at}: {text}", "Reminder at {at}: {text}",
                     "I want to be reminded at {at} to {text}", "At {at}, ping me to {text}"),
    "translate": ("Translate \"{text}\" into {target_lang}",),
    "get_stock_price": ("What does {ticker} trade at", "Tell me the price of {ticker}"),
    "set_thermostat": ("Set the thermostat to {temperature} degrees",
                       "Put the heating on {temperature} degrees",
                       "Make the house {temperature} degrees"),
}

WIDE_SLOTS: dict[str, dict[str, tuple[str, ...]]] = {
    "get_weather": {"days": ("as a {days} day forecast", "for a {days}-day stretch")},
    "shell": {"timeout_s": ("with a {timeout_s}s timeout", "giving it {timeout_s} seconds")},
    "search_web": {"top_k": ("for the top {top_k} results", "{top_k} results only")},
    "read_file": {"limit": ("the first {limit} lines", "a {limit} line chunk"),
                  "offset": ("after line {offset}", "from row {offset}")},
    "create_event": {"duration_minutes": ("taking {duration_minutes} minutes",
                                          "{duration_minutes} minutes long",
                                          "as a {duration_minutes} minute slot",
                                          "for a {duration_minutes}-minute block"),
                     "time": ("at {time} sharp", "from {time} on")},
}

# Further phrasings of enum and boolean values, by parameter, then value.
WIDE_PHRASES: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    "get_weather": {"unit": {"celsius": ("in degrees C", "with celsius", "in metric units"),
                             "fahrenheit": ("in degrees F", "with fahrenheit",
                                            "in imperial units")}},
    "search_web": {"safe": {"true": ("with safesearch", "filtered safely"),
                            "false": ("unfiltered", "with no safe search")}},
    "list_files": {"hidden": {"true": ("and show hidden files", "hidden files included",
                                       "plus the hidden ones"),
                              "false": ("no hidden files", "hidden files excluded",
                                        "ignoring hidden files")}},
    "set_reminder": {"repeat": {"never": ("one time", "a single time", "just this once",
                                          "with no repeat", "without repeating"),
                                "daily": ("each day", "on a daily basis", "every morning"),
                                "weekly": ("each week", "on a weekly basis", "every monday")}},
    "get_stock_price": {"exchange": {"NASDAQ": ("traded on NASDAQ", "from NASDAQ"),
                                     "NYSE": ("traded on NYSE", "from NYSE")}},
    "set_thermostat": {"mode": {"heat": ("on heat", "in heating mode", "set to heat"),
                                "cool": ("on cool", "in cooling mode", "set to cool"),
                                "auto": ("on auto", "in automatic mode", "set to auto")}},
}
