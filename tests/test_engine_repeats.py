"""testkit.engine: interleaved repeats are paired with the plain engine of the same round; the warm-up;
the paused A/B's cycles (and benchmarks.demo_engine's --cycles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.engine import PAUSED_AB_ORDER, format_table, paused_ab_order, summarize_repeats

REPO = Path(__file__).resolve().parents[1]


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
    assert "| sam_k0 | 3 | 49.0, 40.0, 45.0 | 0.980 [0.9, 1.0] | 0.980 [0.9, 1.0] | 1.020 [1.0, 1.1] |" in table


def test_each_setting_is_compared_with_the_fastest_other_setting_of_its_round():
    """The online switch's greedy target: against the best fixed setting of the same round."""
    runs = {
        "none": [run(0, 10.0, 1.0), run(1, 10.0, 1.0)],
        "fixed_a": [run(0, 20.0, 1.0), run(1, 15.0, 1.0)],
        "fixed_b": [run(0, 18.0, 1.0), run(1, 16.0, 1.0)],
        "sam_auto": [run(0, 19.0, 1.0), run(1, 16.0, 1.0)],
    }
    rows = summarize_repeats(runs)["sampled"]
    assert rows["sam_auto"]["speed_vs_best_other_median"] == 0.975  # 19 / 20, 16 / 16
    assert rows["sam_auto"]["speed_vs_best_other_range"] == [0.95, 1.0]
    assert rows["fixed_a"]["speed_vs_best_other_median"] == 0.995  # 20 / 19, 15 / 16
    assert rows["none"]["speed_vs_best_other_range"] == [0.5, 0.625]


def test_greedy_identity_is_counted_over_the_rounds_compared():
    def greedy(round_, identical=None):
        part = {"tok_per_s": 10.0, "wall_s": 10.0, "engine_cpu_s": 20.0}
        if identical is not None:
            part["vs_none"] = {"identical": identical, "n_diverged": 0 if identical else 1, "diverged": []}
        return {"round": round_, "greedy": part}

    runs = {
        "none": [greedy(0), greedy(1), greedy(2)],
        "sam_auto": [greedy(0, True), greedy(1, False), greedy(2, True)],
    }
    rows = summarize_repeats(runs)["greedy"]
    assert rows["sam_auto"]["identical_rounds"] == [2, 3]
    assert "identical_rounds" not in rows["none"]
    table = format_table({"settings": {}, "summary": {"repeats": summarize_repeats(runs)}})
    assert "outputs identical to none's, rounds: sam_auto 2/3" in table


def test_a_round_without_its_none_is_left_out():
    runs = {"none": [run(0, 50.0, 200.0)], "sam_k0": [run(0, 45.0, 220.0), run(1, 10.0, 900.0)]}
    assert summarize_repeats(runs)["sampled"]["sam_k0"]["rounds"] == 1


def test_the_warm_up_pause_answers_false_on_an_engine_without_sam():
    """The warm-up pauses SAM through a callable, not the plugin's RPC, which plain engines lack."""
    from types import SimpleNamespace

    from testkit.engine import _pause_sam

    assert _pause_sam(SimpleNamespace(model_runner=SimpleNamespace(drafter=None)), True) is False


def measured_round(wall, tokens, steps, steps_on, drafts, accepted):
    """What measure_part returns for one round (counter deltas, no rates)."""
    return {
        "requests": 4,
        "wall_s": wall,
        "output_tokens": tokens,
        "hit_max_tokens": 4,
        "engine_cpu_s": 2 * wall,
        "loadavg_1m_before_after": [1.0, 1.5],
        "probe": {
            "steps": steps,
            "drafter_calls": steps,
            "drafter_calls_with_drafts": steps_on,
            "drafter_seconds": 0.01,
            "tail_seconds": wall / 2,
            "tail_steps": steps // 2,
        },
        "vllm_counters": {
            "num_drafts": drafts,
            "num_draft_tokens": 3 * drafts,
            "num_accepted_tokens": accepted,
            "num_accepted_tokens_per_pos": [accepted, 0, 0],
        },
        "sam": {
            "steps": steps,
            "steps_on": steps_on,
            "calls": steps,
            "drafter_seconds": 0.01,
            "num_measured_drafts": drafts,
            "num_accepted_tokens": accepted,
        },
        "sam_after": {"live_requests": 0, "drafter_nbytes": 100, "switch": {"round": wall}},
    }


def test_a_part_in_two_rounds_reports_their_total():
    from testkit.engine import describe_part

    one, two = measured_round(10.0, 400, 100, 10, 10, 5), measured_round(30.0, 400, 300, 0, 0, 0)
    part = describe_part("sampled", [one, two])
    assert part["wall_s"] == 40.0 and part["output_tokens"] == 800 and part["requests"] == 8
    assert part["tok_per_s"] == 20.0  # total tokens over total time, not the mean of 40 and 13.3
    assert part["engine_steps"] == 400 and part["tail_s"] == 20.0 and part["tail_steps"] == 200
    assert part["frac_steps_on"] == 0.025 and part["frac_drafter_calls_with_drafts"] == 0.025
    assert part["mean_acceptance_length"] == 1.5 and part["vllm_counters"]["num_accepted_tokens_per_pos"] == [5, 0, 0]
    assert part["rounds_wall_s"] == [10.0, 30.0] and part["switch"] == {"round": 30.0}  # the last reading
    assert describe_part("sampled", [one])["tok_per_s"] == 40.0 and "rounds_wall_s" not in describe_part("s", [one])


def test_drawn_lengths_give_each_sibling_its_own_request_and_length():
    from testkit.engine import Workload, sampled_requests

    wl = Workload(prompts=2, n=3, max_tokens=64, greedy_prompts=1, lengths="lognormal", median_tokens=16, seed=0)
    wl.prompt_token_ids = [[1, 2, 3], [4, 5]]
    inputs, params = sampled_requests(wl)
    assert [x["prompt_token_ids"] for x in inputs] == [[1, 2, 3]] * 3 + [[4, 5]] * 3
    assert [p.max_tokens for p in params] == wl.sampled_lengths()  # the same draw in every arm and round
    assert all(p.ignore_eos and p.n == 1 and p.temperature == wl.temperature for p in params)


def test_paused_ab_cycles_repeat_off_on_on_off_then_greedy_pairs_by_turns():
    order = paused_ab_order(3)
    assert order[:12] == (("sampled", "off"), ("sampled", "on"), ("sampled", "on"), ("sampled", "off")) * 3
    assert [arm for part, arm in order[12:]] == ["on", "off", "off", "on", "on", "off"]
    assert {part for part, _ in order[12:]} == {"greedy"}
    assert paused_ab_order(1) == PAUSED_AB_ORDER and len(PAUSED_AB_ORDER) == 6
    with pytest.raises(ValueError, match="cycles must be >= 1"):
        paused_ab_order(0)


def test_demo_rejects_cycles_below_one(capsys):
    from benchmarks import demo_engine as demo

    assert demo.parse_args(["--cycles", "3"]).cycles == 3
    with pytest.raises(SystemExit):
        demo.parse_args(["--cycles", "0"])
    assert "must be >= 1, got 0" in capsys.readouterr().err
