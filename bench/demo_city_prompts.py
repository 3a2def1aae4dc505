"""Real city names in held-out weather requests: a prompt file for `bench_demo_accuracy --heldout`.

The held-out set's names come from the same syllable generator as the training names
(`values.fresh_name`), so its figure says how well the demo copies names of that kind, not a
city a newcomer types. This writes the committed set's first `--requests` `get_weather` prompts
once per city of a list, the city put in place of the generated name in the request and the
expected call:

    python -m bench.demo_city_prompts --cities training OUT.json   # listed in training's half
    python -m bench.demo_city_prompts --cities held-out OUT.json   # the held-out half's cities
    python -m bench.bench_demo_accuracy --heldout OUT.json --count 100

`training` is 20 cities of the training lists (Oslo, Madrid, … — the cities a README reader is
likely to try); `held-out` the first 20 of the held-out half's list, never a training value (a
city whose tokens have no trained row cannot be written: untrained rows never win the argmax).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.bench_demo_accuracy import COMMITTED_HELDOUT
from services.demo.lists import pool

TRAINING_CITIES = ("Oslo", "Madrid", "Paris", "Berlin", "Tokyo", "Lima", "Cairo", "Vienna",
                   "Prague", "Dublin", "Lisbon", "Warsaw", "Helsinki", "Toronto", "Sydney",
                   "Nairobi", "Bogota", "Seoul", "Mumbai", "Chicago")
CITY_COUNT = 20


def cities(which: str) -> tuple[str, ...]:
    if which == "training":
        return TRAINING_CITIES
    return pool("city", True)[:CITY_COUNT]


def weather_requests(entries: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The first `count` entries that call get_weather with a city their last message says."""
    chosen = [e for e in entries if e["expected"]["name"] == "get_weather"
              and e["expected"]["arguments"]["city"] in e["request"]["messages"][-1]["content"]]
    if len(chosen) < count:
        raise SystemExit(f"only {len(chosen)} get_weather prompts, not {count}")
    return chosen[:count]


def with_city(entry: dict[str, Any], city: str) -> dict[str, Any]:
    """`entry` with `city` in place of its expected city, in the last message and the call."""
    entry = json.loads(json.dumps(entry))
    arguments = entry["expected"]["arguments"]
    message = entry["request"]["messages"][-1]
    message["content"] = message["content"].replace(arguments["city"], city)
    arguments["city"] = city
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cities", choices=("training", "held-out"), default="training")
    parser.add_argument("--requests", type=int, default=5,
                        help="get_weather prompts of the committed held-out set to use")
    args = parser.parse_args()
    requests = weather_requests(json.loads(COMMITTED_HELDOUT.read_text(encoding="utf-8")),
                                args.requests)
    prompts = [with_city(entry, city) for entry in requests for city in cities(args.cities)]
    args.out.write_text(json.dumps(prompts, indent=1) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(prompts)} prompts ({args.requests} requests × "
          f"{len(cities(args.cities))} cities)")


if __name__ == "__main__":
    main()
