"""The proposer's own counters, and per-step metrics from their cumulative snapshots.

vLLM's spec-decode counters stay authoritative for acceptance; these add what vLLM cannot see:
how often the switch turned speculation on, acceptance per draft position, drafter time, and the
requests the drafter holds. A snapshot (``SamMetrics.as_dict``) is cumulative; ``SamStepTracker``
turns the snapshots of several engines into one training step's ``rollout/sam_*`` metrics.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

METRIC_PREFIX = "rollout/sam_"

# the additive counters of a snapshot (SamMetrics.as_dict), besides drafter time
COUNTERS = (
    "calls",
    "steps",
    "steps_on",
    "num_drafts",
    "num_draft_tokens",
    "num_measured_drafts",
    "num_accepted_tokens",
    "decode_row_steps",
    "requests_started",
    "requests_finished",
    "requests_with_store",
)


class SamMetrics:
    """Counters kept by the stepper.

    Acceptance is inferred from how far each drafted row advanced by the next call:
    accepted = min(new_tokens - 1, draft_len). Rows that leave the batch in between are not counted.
    """

    def __init__(self, k: int):
        self.k = k
        self.calls = 0  # proposer calls
        self.steps = 0  # calls with at least one decode row
        self.steps_on = 0  # of those, calls where speculation was on (threshold)
        self.drafter_seconds = 0.0
        self.first_call_seconds = 0.0  # the proposer's first call (its numba kernels compile before serving)
        self.num_drafts = 0  # rows that received >= 1 draft token
        self.num_draft_tokens = 0
        self.num_measured_drafts = 0  # drafts whose outcome was observed
        self.num_accepted_tokens = 0
        self.drafts_by_accepted = [0] * (k + 1)  # [a]: measured drafts with a tokens accepted (a draft has <= k)
        self.decode_row_steps = 0  # decode rows seen (one per request per step)
        self.started = 0
        self.finished = 0
        self.started_with_store = 0  # started requests whose prompt had responses in the prompt store
        self.peak_drafter_nbytes = 0  # sampled every NBYTES_EVERY calls
        self.instance = uuid.uuid4().hex  # a restarted engine's counters are new ones, even where larger

    def count_accepted(self, accepted: list[int]) -> None:
        """One step's measured drafts, each by how many of its tokens were accepted."""
        self.num_measured_drafts += len(accepted)
        self.num_accepted_tokens += sum(accepted)
        for tokens in accepted:
            self.drafts_by_accepted[tokens] += 1

    @property
    def accepted_per_pos(self) -> np.ndarray:
        """[p]: measured drafts whose token p (0-based) was accepted, those with more than p accepted."""
        with_at_least = np.cumsum(self.drafts_by_accepted[::-1])[::-1]  # [a]: drafts with >= a accepted
        return with_at_least[1:]

    def as_dict(self) -> dict:
        m = max(self.num_measured_drafts, 1)
        return {
            "calls": self.calls,
            "steps": self.steps,
            "steps_on": self.steps_on,
            "frac_steps_on": self.steps_on / self.steps if self.steps else 0.0,
            "drafter_seconds": self.drafter_seconds,
            "drafter_ms_per_call": 1e3 * self.drafter_seconds / self.calls if self.calls else 0.0,
            "drafter_first_call_ms": 1e3 * self.first_call_seconds,
            "drafter_ms_per_call_after_first": (
                1e3 * (self.drafter_seconds - self.first_call_seconds) / (self.calls - 1) if self.calls > 1 else 0.0
            ),
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_measured_drafts": self.num_measured_drafts,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": 1.0 + self.num_accepted_tokens / m if self.num_measured_drafts else 1.0,
            "acceptance_per_pos": (self.accepted_per_pos / m).tolist(),
            "decode_row_steps": self.decode_row_steps,
            "requests_started": self.started,
            "requests_finished": self.finished,
            "requests_with_store": self.started_with_store,
            "peak_drafter_nbytes": self.peak_drafter_nbytes,
            "instance": self.instance,
        }


def counters_of(snapshot: Mapping[str, Any]) -> dict[str, float]:
    """The additive counters of one snapshot, drafter seconds included."""
    c = {name: float(snapshot.get(name, 0)) for name in COUNTERS}
    c["drafter_seconds"] = float(snapshot.get("drafter_seconds", 0.0))
    return c


def counters_delta(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> dict[str, float]:
    """after - before for the additive counters; a counter that went backwards means the engine
    restarted, and then ``after`` is the delta."""
    now = counters_of(after)
    prev = counters_of(before or {})
    if any(now[n] < prev[n] for n in now) or (before and before.get("instance") != after.get("instance")):
        return now
    return {n: now[n] - prev[n] for n in now}


class SamStepTracker:
    """Turns cumulative per-engine snapshots into per-step metrics (difference since last step)."""

    def __init__(self) -> None:
        self._previous: dict[str, Mapping[str, Any]] = {}

    def step_metrics(self, snapshots: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        if not snapshots:
            return {}
        total = dict.fromkeys((*COUNTERS, "drafter_seconds"), 0.0)
        for key, snap in snapshots.items():
            for n, v in counters_delta(snap, self._previous.get(key)).items():
                total[n] += v
            self._previous[key] = snap
        out = step_metrics_from_deltas(total, engines=len(snapshots))
        # requests the drafters hold now: the last engine step's finishers are freed with the next step
        out[f"{METRIC_PREFIX}live_requests"] = float(sum(s.get("live_requests", 0) for s in snapshots.values()))
        out |= prompt_store_metrics(snapshots)
        return out


def prompt_store_metrics(snapshots: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """What the engines' prompt stores hold now and their hit fraction since start (none when off).
    Cumulative, not per step: a revisit comes an epoch later, so a step's own hits say little."""
    stores = [s["prompt_store"] for s in snapshots.values() if s.get("prompt_store")]
    if not stores:
        return {}
    visits = sum(st["hits"] + st["misses"] for st in stores)
    p = METRIC_PREFIX
    return {
        f"{p}prompt_store_bytes": float(sum(st["nbytes"] for st in stores)),
        f"{p}prompt_store_prompts": float(sum(st["prompts"] for st in stores)),
        f"{p}prompt_store_hit_fraction": sum(st["hits"] for st in stores) / visits if visits else 0.0,
    }


def step_metrics_from_deltas(d: Mapping[str, float], engines: int) -> dict[str, float]:
    p = METRIC_PREFIX
    measured, accepted, rows = d["num_measured_drafts"], d["num_accepted_tokens"], d["decode_row_steps"]
    return {
        # tokens per verified draft (vLLM's definition: 1 + accepted / drafts); 1.0 without drafts
        f"{p}acceptance_length": 1.0 + accepted / measured if measured else 1.0,
        # tokens per decode row-step, drafted or not
        f"{p}tokens_per_row_step": 1.0 + accepted / rows if rows else 1.0,
        f"{p}spec_on_fraction": d["steps_on"] / d["steps"] if d["steps"] else 0.0,
        f"{p}drafter_ms": 1e3 * d["drafter_seconds"] / d["calls"] if d["calls"] else 0.0,
        f"{p}drafter_s": d["drafter_seconds"] / engines,
        f"{p}draft_tokens": d["num_draft_tokens"],
        f"{p}accepted_tokens": accepted,
        f"{p}requests_started": d["requests_started"],
        f"{p}requests_finished": d["requests_finished"],
        # started requests that draft from their prompt's earlier responses (prompt store)
        f"{p}requests_with_store": d["requests_with_store"],
        f"{p}engines": float(engines),
    }


class GenerationStepTracker:
    """Response tokens generated in a step over every rollout replica, and rollout seconds per 1,000 of
    them (``timing_s/gen``, every generation batch of a DAPO step): comparable between the arms, which
    generate different numbers of tokens (refills, response lengths)."""

    def __init__(self) -> None:
        self._previous: dict[str, int] = {}

    def step_metrics(self, generated: Mapping[str, int], rollout_seconds: float | None) -> dict[str, float]:
        if not generated:
            return {}
        tokens = 0
        for key, total in generated.items():
            before = self._previous.get(key, 0)
            tokens += total - before if total >= before else total  # a restarted server counts from zero
            self._previous[key] = total
        out = {"rollout/generated_tokens": float(tokens)}
        if rollout_seconds and tokens:
            out["rollout/gen_s_per_1k_tokens"] = 1e3 * rollout_seconds / tokens
        return out
