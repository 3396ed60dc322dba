"""The draft-length selection rule of benchmarks/draft_length.py, on made-up replay results."""

from benchmarks import draft_length as dl


def fake_results(gains: dict[str, list[float]]) -> dict:
    """Two trace sets x two epochs; `gains[label]`: priced gain at VERIFY_COST per replay, in that order."""
    price = f"{dl.VERIFY_COST:g}"
    results: dict = {}
    replays = [(n, e) for n in ("a", "b") for e in dl.EPOCHS]
    for i, (name, epoch) in enumerate(replays):
        row = {label: {"priced_gain": {price: g[i]}, "by_position": {}} for label, g in gains.items()}
        results.setdefault(name, {}).setdefault("tune", {})[epoch] = row
    return results


def test_the_rule_takes_the_best_mean_among_those_never_slower_than_the_default():
    base = [1.0, 2.0, 1.0, 1.0]
    cap16 = [dl.match_name(16, s, p) for s in dl.MATCH_SCALES for p in dl.MIN_TOKEN_PROBS]
    gains = {label: base for label in dl.candidates()}
    gains[dl.BASELINE] = base
    gains[cap16[0]] = [1.01, 2.02, 1.0, 1.0]  # never slower, small mean gain
    gains[cap16[1]] = [1.2, 4.0, 1.0, 0.99]  # the largest mean, but slower on one replay
    gains[cap16[2]] = [1.05, 2.4, 1.0, 1.0]  # never slower, the largest mean among those
    chosen = dl.choose(fake_results(gains))
    assert chosen[16] == cap16[2]


def test_priced_gain_and_slim():
    assert dl.priced_gain(2.0, 4.0, 0.25) == 1.0
    results = fake_results({"x": [1.0] * 4, "y": [1.0] * 4})
    dl.slim(results, keep=["x"])
    row = results["a"]["tune"][dl.EPOCHS[0]]
    assert "by_position" in row["x"] and "by_position" not in row["y"]
