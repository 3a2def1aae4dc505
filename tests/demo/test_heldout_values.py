from services.demo.heldout_values import HeldOutValues

HELD = {"door", "Hockey", "/srv/data", "Nirzonddeis", "soup volcanoes retro"}


def test_by_default_a_value_holding_any_held_out_value_is_refused() -> None:
    guard = HeldOutValues(HELD, pool_words_whole=False)
    assert guard.refuses(["door cache"]) and guard.refuses(["Hockey night"])
    assert guard.refuses(["notes", "/srv/data/logs"])
    assert not guard.refuses(["cache", "/srv/logs"])


def test_a_held_out_pool_word_is_refused_only_as_the_whole_value() -> None:
    guard = HeldOutValues(HELD, pool_words_whole=True)
    assert guard.refuses(["door"]) and guard.refuses(["Hockey"])
    assert not guard.refuses(["door cache", "front door", "Hockey night"])


def test_names_paths_and_word_combinations_stay_refused_inside_longer_values() -> None:
    guard = HeldOutValues(HELD, pool_words_whole=True)
    assert guard.refuses(["/srv/data/logs"])
    assert guard.refuses(["Nirzonddeis Baxter"])
    assert guard.refuses(["big soup volcanoes retro"])
    assert not guard.refuses(["soup volcanoes", "retro soup"])
