"""Per-step routing metrics from the router's cumulative snapshots (rollout.routing_metrics)."""

import pytest

from rollout.routing_metrics import RoutingStepTracker, store_hit_rate_on_revisits


def snapshot(requests, by_server, peaks, **counters):
    base = dict.fromkeys(
        ("keyed_requests", "sibling_observations", "colocated_share_sum", "revisit_requests",
         "revisit_store_share_sum", "overflowed_groups"), 0)  # fmt: skip
    return {**base, "requests": requests, "requests_by_server": by_server, "peak_inflight_by_server": peaks,
            **counters}  # fmt: skip


def test_a_step_reports_the_difference_since_the_last_step():
    tracker = RoutingStepTracker()
    first = tracker.step_metrics(
        snapshot(16, {"a": 8, "b": 8}, {"a": 8, "b": 8}, sibling_observations=12, colocated_share_sum=12.0)
    )
    assert first["rollout/requests"] == 16 and first["rollout/route_group_colocation"] == 1.0
    assert first["rollout/route_requests_max_over_mean"] == 1.0
    assert "rollout/route_revisit_store_share" not in first  # no revisit yet
    second = tracker.step_metrics(
        snapshot(
            40,
            {"a": 20, "b": 20},
            {"a": 12, "b": 4},
            sibling_observations=30,
            colocated_share_sum=21.0,
            revisit_requests=16,
            revisit_store_share_sum=12.0,
        )  # fmt: skip
    )
    assert second["rollout/requests"] == 24
    assert second["rollout/route_group_colocation"] == pytest.approx(9.0 / 18)
    assert second["rollout/route_revisit_store_share"] == 0.75
    assert second["rollout/route_inflight_max_over_mean"] == 1.5
    assert second["rollout/route_requests_max_over_mean"] == 1.0


def test_a_restarted_router_counts_from_zero():
    tracker = RoutingStepTracker()
    tracker.step_metrics(snapshot(100, {"a": 100}, {"a": 4}))
    after = tracker.step_metrics(snapshot(8, {"a": 8}, {"a": 8}))
    assert after["rollout/requests"] == 8


def test_store_hit_rate_on_revisits_needs_both_sides():
    assert store_hit_rate_on_revisits({"rollout/route_revisit_requests": 8.0}) == {}
    assert store_hit_rate_on_revisits({"rollout/sam_requests_with_store": 3.0}) == {}
    both = {"rollout/route_revisit_requests": 8.0, "rollout/sam_requests_with_store": 6.0}
    assert store_hit_rate_on_revisits(both) == {"rollout/sam_store_hit_rate_on_revisits": 0.75}


def test_no_router_no_metrics():
    assert RoutingStepTracker().step_metrics(None) == {}


def test_rollout_time_per_generated_token_sums_replicas_and_survives_a_restart():
    from rollout.metrics import GenerationStepTracker

    tracker = GenerationStepTracker()
    first = tracker.step_metrics({"rollout_0": 600, "rollout_1": 400}, rollout_seconds=20.0)
    assert first == {"rollout/generated_tokens": 1000.0, "rollout/gen_s_per_1k_tokens": 20.0}
    second = tracker.step_metrics({"rollout_0": 900, "rollout_1": 100}, rollout_seconds=8.0)  # rollout_1 restarted
    assert second["rollout/generated_tokens"] == 400.0 and second["rollout/gen_s_per_1k_tokens"] == 20.0
    assert tracker.step_metrics({}, rollout_seconds=5.0) == {}
