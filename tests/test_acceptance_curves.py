"""Acceptance against context: the per-bin numbers on a tiny trace worked out by hand, the bin edges, and
the JSON schema the rollout simulator reads."""

import json

import numpy as np
import pytest

from benchmarks.acceptance_curves import acceptance_profile, bin_midpoints, long_responses_only, power_of_two_edges
from benchmarks.drafters import SamDrafter
from benchmarks.replay import POSITION_BINS, ReplayStats, bin_labels, replay
from sam_rollout.drafter import DraftConfig
from testkit.data import TraceGroup

CYCLE = np.arange(8, dtype=np.int32)  # 8 distinct tokens, none of them in the prompt
PROMPT = np.arange(100, 110, dtype=np.int32)


def cycle_trace() -> list[TraceGroup]:
    """One response: the cycle four times (32 tokens).

    Own-context SAM, k=3: position 0 comes from prefill; steps at 1..8 find no repeated suffix (no draft,
    1 token each); from position 9 the last token repeats and the draft is the next 3 cycle tokens, all
    right: 4 tokens at 9, 13, 17, 21, 25, and the last 3 tokens at 29. With edges (0, 8, 16):
    bin 0: steps 1..7 -> 7 steps, 7 tokens, 0 drafted; bin 8: steps 8, 9, 13 -> 9 tokens, 6 drafted;
    bin 16+: steps 17, 21, 25, 29 -> 15 tokens, 12 drafted."""
    return [TraceGroup(PROMPT, [np.tile(CYCLE, 4)])]


def test_curve_on_a_hand_checked_trace():
    profile = acceptance_profile(
        cycle_trace(), "cycle", k=3, bin_edges=[0, 8, 16], methods=["sam_own"], log=lambda *_: None
    )
    own = profile["methods"]["sam_own"]
    assert own["steps"] == [7, 3, 4]
    assert own["tokens_per_step"] == [1.0, 3.0, 3.75]
    assert own["drafted_per_step"] == [0.0, 2.0, 3.0]
    assert own["mean_tokens_per_step"] == pytest.approx(31 / 14)


def test_empty_bins_are_null_and_the_profile_is_json():
    profile = acceptance_profile(
        cycle_trace(), "cycle", k=3, bin_edges=[0, 8, 16, 64], methods=["sam_own", "sam_group"], log=lambda *_: None
    )
    back = json.loads(json.dumps(profile))
    assert back["k"] == 3 and back["trace_set"] == "cycle" and back["bin_edges"] == [0, 8, 16, 64]
    for key in ("sam_own", "sam_group"):
        entry = back["methods"][key]
        assert len(entry["tokens_per_step"]) == len(entry["drafted_per_step"]) == len(entry["steps"]) == 4
        assert entry["steps"][3] == 0 and entry["tokens_per_step"][3] is None
        assert all(isinstance(s, int) for s in entry["steps"])
    # one response: its group is itself, so group-aware drafts exactly as own context
    assert back["methods"]["sam_group"]["tokens_per_step"] == back["methods"]["sam_own"]["tokens_per_step"]


def test_derived_edges_stop_below_the_longest_response():
    assert power_of_two_edges(4096) == [0, 128, 256, 512, 1024, 2048]
    assert power_of_two_edges(4097) == [0, 128, 256, 512, 1024, 2048, 4096]
    assert power_of_two_edges(100) == [0]
    assert bin_midpoints([0, 128, 256]) == [64.0, 192.0, 384.0]


def test_replay_stats_keep_their_default_bins_and_reject_bad_ones():
    assert ReplayStats().bin_edges == POSITION_BINS
    assert bin_labels() == ["0-128", "128-256", "256-512", "512-1024", "1024-2048", "2048+"]
    for bad in [(), (1, 8), (0, 8, 8), (0, 16, 8)]:
        with pytest.raises(ValueError):
            ReplayStats(bin_edges=bad)


def test_custom_bins_only_regroup_the_steps():
    drafter = lambda: SamDrafter("own", DraftConfig(group_aware=False))  # noqa: E731
    default = replay(drafter(), cycle_trace())
    fine = replay(drafter(), cycle_trace(), bin_edges=(0, 4, 8, 12, 16, 20))
    assert (fine.steps, fine.tokens, fine.drafted) == (default.steps, default.tokens, default.drafted)
    assert fine.bin_steps.sum() == default.bin_steps.sum() == default.steps


def test_cohort_keeps_only_long_responses_and_drops_empty_groups():
    short, long_ = np.arange(5, dtype=np.int32), np.arange(50, dtype=np.int32)
    groups = [TraceGroup(PROMPT, [short, long_, short]), TraceGroup(PROMPT, [short])]
    kept = long_responses_only(groups, 50)
    assert len(kept) == 1 and [len(r) for r in kept[0].responses] == [50]


def test_revisit_profile_scores_current_visits_with_the_store():
    """Five identical responses: the first four are the earlier visit; the fifth, drafted from the
    stored ones, emits k + 1 tokens a step once it has a match."""
    groups = [TraceGroup(PROMPT, [np.tile(CYCLE, 4)] * 5)]
    profile = acceptance_profile(
        groups, "cycle", k=3, bin_edges=[0, 16], methods=["sam_frequent_64k_store"], log=lambda *_: None, revisits=True
    )
    stored = profile["methods"]["sam_frequent_64k_store"]
    assert sum(stored["steps"]) == 8  # 31 decode tokens at 4 a step (the last step emits 3)
