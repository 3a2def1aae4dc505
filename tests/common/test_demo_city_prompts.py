"""The real-city prompt file: committed held-out weather requests with a listed city in place of
their generated name."""
from bench.bench_demo_accuracy import load_heldout
from bench.demo_city_prompts import TRAINING_CITIES, cities, weather_requests, with_city
from services.demo.lists import pool


def test_a_city_replaces_the_generated_name_in_the_request_and_the_expected_call() -> None:
    requests = weather_requests(load_heldout(100), 5)
    assert len(requests) == 5 and all(e["expected"]["name"] == "get_weather" for e in requests)
    original = requests[0]
    name = original["expected"]["arguments"]["city"]
    moved = with_city(original, "Madrid")
    assert moved["expected"]["arguments"]["city"] == "Madrid"
    text = moved["request"]["messages"][-1]["content"]
    assert "Madrid" in text and name not in text
    assert original["expected"]["arguments"]["city"] == name        # the entry is not changed


def test_the_two_city_lists_are_the_training_half_and_the_held_out_half() -> None:
    assert set(TRAINING_CITIES) <= set(pool("city", False))
    assert len(cities("held-out")) == 20
    assert not set(cities("held-out")) & set(pool("city", False))
