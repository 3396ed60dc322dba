"""Per-step routing metrics from the rollout router's cumulative snapshots (``SamLoadBalancer.routing_stats``).

Both arms of an A/B report them: the SAM arm's prompt-affinity router and the baseline's, which
routes as verl's default does and only measures. Each metric's numerator counts a subset of what its
denominator counts (docs/metrics.md defines each in one line):

- ``rollout/requests``: requests routed in the step (a DAPO step with refills routes several batches),
  and ``rollout/route_continued_requests``, those that continued a trajectory (a later turn, a resumed
  partial rollout: same request id, a prompt extending its first one), which count in no other metric
  as requests of their prompt;
- ``rollout/route_group_colocation``: for each request that started while siblings of its group were in
  flight, the share of those siblings on its own replica, averaged (1.0: every group on one engine);
- ``rollout/route_revisit_requests`` and ``rollout/route_revisit_store_share``: requests of a prompt
  whose earlier visit ended, and, averaged over them, the share of that prompt's last visit that ran on
  the request's replica (where its stored responses are; 1.0 when groups return whole to their replica,
  about 1/R under verl's default routing); ``rollout/route_revisit_store_available``, the same share
  counting what a store handoff copied to the request's replica; ``rollout/route_store_handoffs`` and
  ``..._failures``: groups whose store was (or could not be) copied to their replica, and
  ``..._seconds``, the router's time waiting for those copies;
- ``rollout/route_inflight_max_over_mean`` (and ``..._work_...``): the replicas' simultaneous load over
  the step, the integral over time of the most loaded replica's in-flight requests (work) over the
  integral of the mean over replicas, sampled at every routing event; ``rollout/route_requests_max_over_mean``:
  requests routed per replica in the step, max over mean;
- ``rollout/sam_store_hit_rate``: of the requests SAM's engines started in the step, the share that
  found their prompt's stored responses on their engine (both counts are the engines').
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTERS = (
    "requests",
    "continued_requests",
    "keyed_requests",
    "sibling_observations",
    "colocated_share_sum",
    "revisit_requests",
    "revisit_store_share_sum",
    "revisit_store_available_sum",
    "overflowed_groups",
    "store_handoffs",
    "store_handoff_failures",
    "store_handoff_seconds",
    "load_max_integral",
    "load_mean_integral",
    "work_max_integral",
    "work_mean_integral",
)
STORE_HITS = "rollout/sam_requests_with_store"  # SAM's per-step counters (sam_rollout.metrics)
STARTED = "rollout/sam_requests_started"


def _max_over_mean(values) -> float:
    values = [float(v) for v in values]
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def _share(part: float, whole: float) -> float:
    """part / whole for counts where part counts a subset of whole's items; clipped against float sums."""
    return min(max(part / whole, 0.0), 1.0)


class RoutingStepTracker:
    """Turns cumulative router snapshots into one training step's metrics (difference since last step)."""

    def __init__(self) -> None:
        self._previous: Mapping[str, Any] | None = None

    def step_metrics(self, snapshot: Mapping[str, Any] | None) -> dict[str, float]:
        if not snapshot:
            return {}
        prev = self._previous or {}
        now_by_server = snapshot.get("requests_by_server", {})
        before = prev.get("requests_by_server", {})
        restarted = any(float(snapshot.get(n, 0)) < float(prev.get(n, 0)) for n in COUNTERS) or any(
            n < before.get(s, 0) for s, n in now_by_server.items()
        )  # a counter went back: a new router, counting from zero
        d = {n: float(snapshot.get(n, 0)) - (0.0 if restarted else float(prev.get(n, 0))) for n in COUNTERS}
        per_server = {s: n - (0 if restarted else before.get(s, 0)) for s, n in now_by_server.items()}
        self._previous = snapshot
        replicas = max(len(per_server), 1)
        out = {
            "rollout/requests": d["requests"],
            "rollout/route_continued_requests": d["continued_requests"],
            "rollout/route_revisit_requests": d["revisit_requests"],
            "rollout/route_overflowed_groups": d["overflowed_groups"],
            "rollout/route_store_handoffs": d["store_handoffs"],
            "rollout/route_store_handoff_failures": d["store_handoff_failures"],
            "rollout/route_store_handoff_seconds": max(d["store_handoff_seconds"], 0.0),
            "rollout/route_replicas": float(len(per_server)),
            "rollout/route_requests_max_over_mean": _max_over_mean(per_server.values()),
        }
        for name, top, mean in (("inflight", "load_max_integral", "load_mean_integral"),
                                ("inflight_work", "work_max_integral", "work_mean_integral")):  # fmt: skip
            ratio = d[top] / d[mean] if d[mean] > 0 else 1.0
            out[f"rollout/route_{name}_max_over_mean"] = min(max(ratio, 1.0), float(replicas))
        if d["sibling_observations"]:
            out["rollout/route_group_colocation"] = _share(d["colocated_share_sum"], d["sibling_observations"])
        if d["revisit_requests"]:
            out["rollout/route_revisit_store_share"] = _share(d["revisit_store_share_sum"], d["revisit_requests"])
            out["rollout/route_revisit_store_available"] = _share(
                d["revisit_store_available_sum"], d["revisit_requests"]
            )
        return out


def store_hit_rate(step: Mapping[str, float]) -> dict[str, float]:
    """Of the requests SAM's engines started in the step, the share that started with their prompt's
    stored responses (both counted by the engines, so the rate is in [0, 1])."""
    started = step.get(STARTED, 0.0)
    if STORE_HITS not in step or not started:
        return {}
    return {"rollout/sam_store_hit_rate": step[STORE_HITS] / started}
