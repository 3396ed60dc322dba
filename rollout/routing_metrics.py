"""Per-step routing metrics from the rollout router's cumulative snapshots (``SamLoadBalancer.routing_stats``).

Both arms of an A/B report them: the SAM arm's prompt-affinity router and the baseline's, which
routes as verl's default does and only measures.

- ``rollout/requests``: requests routed in the step (a DAPO step with refills routes several batches);
- ``rollout/route_group_colocation``: for each request that started while siblings of its group were in
  flight, the share of those siblings on its own replica, averaged (1.0: every group on one engine);
- ``rollout/route_revisit_requests`` and ``rollout/route_revisit_store_share``: requests of a prompt
  whose earlier visit ended, and, averaged over them, the share of that prompt's last visit that ran on
  the request's replica (where its stored responses are; 1.0 when groups return whole to their replica,
  about 1/R under verl's default routing);
- ``rollout/route_inflight_max_over_mean``: the replicas' peak in-flight requests in the step, max over
  mean; ``rollout/route_requests_max_over_mean``: requests routed per replica, max over mean;
- ``rollout/sam_store_hit_rate_on_revisits``: requests that started with their prompt's stored responses
  on their engine (SAM's counter) over revisit requests (the router's), where both are measured. Under
  verl's default routing a group spread over every replica leaves part of its responses on each, so this
  reads high there; the store share above says how much of the store a request finds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTERS = (
    "requests",
    "keyed_requests",
    "sibling_observations",
    "colocated_share_sum",
    "revisit_requests",
    "revisit_store_share_sum",
    "overflowed_groups",
)
STORE_HITS = "rollout/sam_requests_with_store"  # SAM's per-step counter (rollout.metrics)


def _max_over_mean(values) -> float:
    values = [float(v) for v in values]
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


class RoutingStepTracker:
    """Turns cumulative router snapshots into one training step's metrics (difference since last step)."""

    def __init__(self) -> None:
        self._previous: Mapping[str, Any] | None = None

    def step_metrics(self, snapshot: Mapping[str, Any] | None) -> dict[str, float]:
        if not snapshot:
            return {}
        prev = self._previous or {}
        restarted = any(float(snapshot.get(n, 0)) < float(prev.get(n, 0)) for n in COUNTERS)
        d = {n: float(snapshot.get(n, 0)) - (0.0 if restarted else float(prev.get(n, 0))) for n in COUNTERS}
        before = {} if restarted else prev.get("requests_by_server", {})
        per_server = {s: n - before.get(s, 0) for s, n in snapshot.get("requests_by_server", {}).items()}
        self._previous = snapshot
        out = {
            "rollout/requests": d["requests"],
            "rollout/route_revisit_requests": d["revisit_requests"],
            "rollout/route_overflowed_groups": d["overflowed_groups"],
            "rollout/route_replicas": float(len(per_server)),
            "rollout/route_requests_max_over_mean": _max_over_mean(per_server.values()),
            "rollout/route_inflight_max_over_mean": _max_over_mean(
                snapshot.get("peak_inflight_by_server", {}).values()
            ),
        }
        if d["sibling_observations"]:
            out["rollout/route_group_colocation"] = d["colocated_share_sum"] / d["sibling_observations"]
        if d["revisit_requests"]:
            out["rollout/route_revisit_store_share"] = d["revisit_store_share_sum"] / d["revisit_requests"]
        return out


def store_hit_rate_on_revisits(step: Mapping[str, float]) -> dict[str, float]:
    """SAM's requests that found their prompt's store over the router's revisit requests, in one step."""
    revisits = step.get("rollout/route_revisit_requests", 0.0)
    if STORE_HITS not in step or not revisits:
        return {}
    return {"rollout/sam_store_hit_rate_on_revisits": step[STORE_HITS] / revisits}
