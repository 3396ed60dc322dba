"""verl hook: SAM's replica under verl's "vllm" rollout name, and SAM metrics in verl's logs.

No fork of verl. Two documented extension points of verl 0.9.1 are used:

- ``RolloutReplicaRegistry.register("vllm", loader)`` (``verl/workers/rollout/replica.py``): the
  trainer looks the replica class up by ``actor_rollout_ref.rollout.name`` when it builds its
  ``LLMServerManager`` (``verl/workers/rollout/llm_server.py``), so registering in the trainer's
  process before that swaps in ``rollout.verl_server.SamvLLMReplica``.
- ``Tracking.log(data, step)`` (``verl/utils/tracking.py``): every trainer (core PPO and
  verl-recipe's DAPO) logs one metrics dict per step through it, to every backend (console,
  wandb, file, ...). The wrapper adds ``rollout/sam_*`` to each training step's dict.

``install()`` does both. The recipes run it in every Ray worker process, the trainer's TaskRunner
included, through Ray's ``runtime_env.worker_process_setup_hook = "rollout.verl_hook.install"``.
It imports verl lazily and no vLLM at all (vLLM loads only when the replica class is asked for).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Mapping

logger = logging.getLogger(__name__)

REPLICA_NAME = "vllm"
METRIC_PREFIX = "rollout/sam_"
_MARK = "__sam_spec_wrapped__"
RPC_TIMEOUT_S = 60.0

# SAM replicas alive in this process (the trainer's), whose servers are asked for counters.
_live_replicas: "weakref.WeakSet[Any]" = weakref.WeakSet()


def install() -> None:
    """Ray worker setup hook: register the SAM replica and wrap verl's metrics logger."""
    register_replica()
    wrap_tracking()


def register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(REPLICA_NAME, _load_sam_replica)


def _load_sam_replica():
    from rollout.verl_server import SamvLLMReplica

    return SamvLLMReplica


def track_replica(replica: Any) -> None:
    """Called by SamvLLMReplica.__init__: its servers are polled for SAM counters each step."""
    _live_replicas.add(replica)


def wrap_tracking() -> None:
    from verl.utils.tracking import Tracking

    if getattr(Tracking.log, _MARK, False):
        return
    original = Tracking.log

    def log(self, data, step, *args, **kwargs):
        if is_training_step(data):
            data = {**data, **_tracker.step_metrics(poll_replicas())}
        return original(self, data, step, *args, **kwargs)

    setattr(log, _MARK, True)
    log.__wrapped__ = original
    Tracking.log = log


def is_training_step(data: Mapping[str, Any]) -> bool:
    """A training step's dict carries stage timings (timing_s/...); a validation-only one does not."""
    return any(str(k).startswith("timing_s/") for k in data)


def poll_replicas() -> dict[str, dict]:
    """Cumulative SAM counters of every live SAM replica (first worker of each engine)."""
    import ray

    replicas = [r for r in list(_live_replicas) if r.sam_enabled and r.servers]
    refs = {r.sam_key: r.servers[0].sam_spec_metrics.remote() for r in replicas}
    out = {}
    for key, ref in refs.items():
        try:
            per_worker = ray.get(ref, timeout=RPC_TIMEOUT_S)
        except Exception as e:  # metrics must never stop training
            logger.warning("SAM metrics from %s unavailable: %s", key, e)
            continue
        first = next((m for m in per_worker or [] if m), None)
        if first is not None:
            out[key] = first
    return out


# ---------------------------------------------------------------------------------------------
# Per-step metrics from cumulative counters
# ---------------------------------------------------------------------------------------------

_COUNTERS = (
    "calls",
    "steps",
    "steps_on",
    "num_drafts",
    "num_draft_tokens",
    "num_measured_drafts",
    "num_accepted_tokens",
    "decode_row_steps",
)


def counters_of(snapshot: Mapping[str, Any]) -> dict[str, float]:
    """The additive counters of one proposer snapshot (``SamMetrics.as_dict``)."""
    c = {name: float(snapshot.get(name, 0)) for name in _COUNTERS}
    c["drafter_seconds"] = float(snapshot.get("drafter_ms_per_call", 0.0)) * c["calls"] / 1e3
    return c


class SamStepTracker:
    """Turns cumulative per-engine counters into per-step metrics (difference since last step).

    A counter that went backwards means the engine restarted: its current value is the delta.
    """

    def __init__(self) -> None:
        self._previous: dict[str, dict[str, float]] = {}

    def step_metrics(self, snapshots: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        if not snapshots:
            return {}
        total = dict.fromkeys((*_COUNTERS, "drafter_seconds"), 0.0)
        for key, snap in snapshots.items():
            now = counters_of(snap)
            before = self._previous.get(key, {})
            restarted = any(now[n] < before.get(n, 0.0) for n in now)
            for n, v in now.items():
                total[n] += v if restarted else v - before.get(n, 0.0)
            self._previous[key] = now
        return step_metrics_from_deltas(total, engines=len(snapshots))


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
        f"{p}engines": float(engines),
    }


_tracker = SamStepTracker()
