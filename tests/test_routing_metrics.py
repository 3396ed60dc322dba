"""Per-step routing metrics from the router's cumulative snapshots (sam_rollout.routing_metrics): the
difference since the last step, and every ratio within its bounds whatever the snapshots."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sam_rollout.routing_metrics import COUNTERS, RoutingStepTracker, store_hit_rate


def snapshot(requests, by_server, **counters):
    return {**dict.fromkeys(COUNTERS, 0), "requests": requests, "requests_by_server": by_server, **counters}


def test_a_step_reports_the_difference_since_the_last_step():
    tracker = RoutingStepTracker()
    first = tracker.step_metrics(
        snapshot(
            16,
            {"a": 8, "b": 8},
            sibling_observations=12,
            colocated_share_sum=12.0,
            load_max_integral=80.0,
            load_mean_integral=80.0,
        )  # fmt: skip
    )
    assert first["rollout/requests"] == 16 and first["rollout/route_group_colocation"] == 1.0
    assert first["rollout/route_requests_max_over_mean"] == 1.0
    assert first["rollout/route_inflight_max_over_mean"] == 1.0
    assert "rollout/route_revisit_store_share" not in first  # no revisit yet
    second = tracker.step_metrics(
        snapshot(
            40,
            {"a": 20, "b": 20},
            sibling_observations=30,
            colocated_share_sum=21.0,
            revisit_requests=16,
            revisit_store_share_sum=12.0,
            revisit_store_available_sum=16.0,
            store_handoffs=2,
            store_handoff_failures=1,
            load_max_integral=200.0,
            load_mean_integral=160.0,
            work_max_integral=30.0,
            work_mean_integral=20.0,
        )  # fmt: skip
    )
    assert second["rollout/requests"] == 24
    assert second["rollout/route_group_colocation"] == pytest.approx(9.0 / 18)
    assert second["rollout/route_revisit_store_share"] == 0.75
    assert second["rollout/route_revisit_store_available"] == 1.0
    assert (second["rollout/route_store_handoffs"], second["rollout/route_store_handoff_failures"]) == (2, 1)
    assert second["rollout/route_inflight_max_over_mean"] == 1.5  # (200 - 80) / (160 - 80)
    assert second["rollout/route_inflight_work_max_over_mean"] == 1.5
    assert second["rollout/route_requests_max_over_mean"] == 1.0


def test_continuations_are_reported_beside_the_requests_they_count_in():
    tracker = RoutingStepTracker()
    tracker.step_metrics(snapshot(12, {"a": 12}, continued_requests=8, keyed_requests=4))
    step = tracker.step_metrics(snapshot(30, {"a": 30}, continued_requests=20, keyed_requests=10))
    assert step["rollout/requests"] == 18 and step["rollout/route_continued_requests"] == 12  # 6 trajectories


def test_a_restarted_router_counts_from_zero():
    tracker = RoutingStepTracker()
    tracker.step_metrics(snapshot(100, {"a": 100}))
    after = tracker.step_metrics(snapshot(8, {"a": 8}))
    assert after["rollout/requests"] == 8


def test_the_store_hit_rate_counts_the_engines_started_requests():
    assert store_hit_rate({"rollout/sam_requests_started": 8.0}) == {}
    assert store_hit_rate({"rollout/sam_requests_with_store": 3.0}) == {}
    both = {"rollout/sam_requests_started": 8.0, "rollout/sam_requests_with_store": 6.0}
    assert store_hit_rate(both) == {"rollout/sam_store_hit_rate": 0.75}


def test_no_router_no_metrics():
    assert RoutingStepTracker().step_metrics(None) == {}


def test_rollout_time_per_generated_token_sums_replicas_and_survives_a_restart():
    from sam_rollout.metrics import GenerationStepTracker

    tracker = GenerationStepTracker()
    first = tracker.step_metrics({"rollout_0": 600, "rollout_1": 400}, rollout_seconds=20.0)
    assert first == {"rollout/generated_tokens": 1000.0, "rollout/gen_s_per_1k_tokens": 20.0}
    second = tracker.step_metrics({"rollout_0": 900, "rollout_1": 100}, rollout_seconds=8.0)  # rollout_1 restarted
    assert second["rollout/generated_tokens"] == 400.0 and second["rollout/gen_s_per_1k_tokens"] == 20.0
    assert tracker.step_metrics({}, rollout_seconds=5.0) == {}


# -- properties: random step logs, as a router and SAM's engines write them --------------------------
@st.composite
def step_logs(draw):
    """Cumulative router snapshots over a few steps (a restart among them), each step adding what a
    router can: shares of at most 1 per counted request, max load between the mean and R x the mean."""
    replicas = draw(st.integers(1, 8))
    names = [f"r{i}" for i in range(replicas)]
    snapshots, total = [], dict.fromkeys(COUNTERS, 0.0)
    by_server = dict.fromkeys(names, 0)
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()) and draw(st.booleans()):  # the router restarted
            total, by_server = dict.fromkeys(COUNTERS, 0.0), dict.fromkeys(names, 0)
        for s in names:
            by_server[s] += draw(st.integers(0, 50))
        requests = draw(st.integers(0, 400))
        siblings = draw(st.integers(0, requests))
        revisits = draw(st.integers(0, requests))
        share = st.floats(0.0, 1.0)
        total["requests"] += requests
        total["sibling_observations"] += siblings
        total["colocated_share_sum"] += sum(draw(st.lists(share, min_size=siblings, max_size=siblings)))
        total["revisit_requests"] += revisits
        total["revisit_store_share_sum"] += sum(draw(st.lists(share, min_size=revisits, max_size=revisits)))
        total["revisit_store_available_sum"] += sum(draw(st.lists(share, min_size=revisits, max_size=revisits)))
        for kind in ("load", "work"):
            mean = draw(st.floats(0.0, 1e4))
            total[f"{kind}_mean_integral"] += mean
            total[f"{kind}_max_integral"] += mean * draw(st.floats(1.0, float(replicas)))
        snapshots.append({**total, "requests_by_server": dict(by_server)})
    return replicas, snapshots


@settings(max_examples=300, deadline=None)
@given(step_logs())
def test_every_routing_ratio_stays_in_its_bounds(log):
    replicas, snapshots = log
    tracker = RoutingStepTracker()
    for snap in snapshots:
        step = tracker.step_metrics(snap)
        for name in ("rollout/route_group_colocation", "rollout/route_revisit_store_share",
                     "rollout/route_revisit_store_available"):  # fmt: skip
            if name in step:
                assert 0.0 <= step[name] <= 1.0, (name, step)
        for name in ("rollout/route_inflight_max_over_mean", "rollout/route_inflight_work_max_over_mean",
                     "rollout/route_requests_max_over_mean"):  # fmt: skip
            assert 1.0 <= step[name] <= replicas + 1e-9, (name, step)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100), st.booleans()), min_size=1, max_size=8))
def test_the_store_hit_rate_stays_in_0_1_through_the_sam_step_tracker(steps):
    """Engine snapshots whose requests with a store are a subset of those started (restarts included)."""
    from sam_rollout.metrics import SamStepTracker

    tracker = SamStepTracker()
    started = hits = 0
    instance = 0
    for new, new_hits, restart in steps:
        if restart:
            started, hits, instance = 0, 0, instance + 1
        started, hits = started + new, hits + min(new_hits, new)
        snap = {"requests_started": started, "requests_with_store": hits, "instance": str(instance)}
        step = tracker.step_metrics({"rollout_0": snap})
        rate = store_hit_rate(step)
        if rate:
            assert 0.0 <= rate["rollout/sam_store_hit_rate"] <= 1.0
