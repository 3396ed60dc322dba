"""benchmarks.engine: interleaved repeats are paired with the plain engine of the same round; the warm-up."""

from __future__ import annotations

from benchmarks.engine import format_table, summarize_repeats


def run(round_, tok_s, cpu_s):
    return {"round": round_, "sampled": {"tok_per_s": tok_s, "wall_s": 100.0 / tok_s, "engine_cpu_s": cpu_s}}


def test_ratios_pair_each_round_with_its_own_none():
    runs = {
        "none": [run(0, 50.0, 200.0), run(1, 40.0, 210.0), run(2, 50.0, 190.0)],
        "sam_k0": [run(0, 49.0, 204.0), run(1, 40.0, 231.0), run(2, 45.0, 190.0)],
    }
    rows = summarize_repeats(runs)["sampled"]
    assert rows["none"]["speed_vs_none_median"] == 1.0
    k0 = rows["sam_k0"]
    assert k0["rounds"] == 3
    assert k0["speed_vs_none_median"] == 0.98  # 0.98, 1.0, 0.9
    assert k0["speed_vs_none_range"] == [0.9, 1.0]
    assert k0["cpu_vs_none_median"] == 1.02 and k0["cpu_vs_none_range"] == [1.0, 1.1]
    assert "greedy" not in summarize_repeats(runs)
    table = format_table({"settings": {}, "summary": {"repeats": summarize_repeats(runs)}})
    assert "| sam_k0 | 3 | 49.0, 40.0, 45.0 | 0.980 [0.9, 1.0] | 1.020 [1.0, 1.1] |" in table


def test_a_round_without_its_none_is_left_out():
    runs = {"none": [run(0, 50.0, 200.0)], "sam_k0": [run(0, 45.0, 220.0), run(1, 10.0, 900.0)]}
    assert summarize_repeats(runs)["sampled"]["sam_k0"]["rounds"] == 1


def test_the_warm_up_pause_answers_false_on_an_engine_without_sam():
    """The warm-up pauses SAM through a callable, not the plugin's RPC, which plain engines lack."""
    from types import SimpleNamespace

    from benchmarks.engine import _pause_sam

    assert _pause_sam(SimpleNamespace(model_runner=SimpleNamespace(drafter=None)), True) is False
