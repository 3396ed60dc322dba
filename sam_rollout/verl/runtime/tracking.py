"""SAM and routing metrics in verl's logs: ``rollout/sam_*`` and ``rollout/route_*`` added to every
training step's metrics dict.

``Tracking.log(data, step)`` (``verl/utils/tracking.py``) is how every verl trainer logs one metrics
dict per step to every backend (console, wandb, file, ...). ``wrap()`` wraps it, in the trainer's
process, to poll the servers of every live SAM replica (registered by ``SamvLLMReplica``) and the
rollout router (our ``SamLoadBalancer``, caught as verl's ``get_router_handle`` builds it) for their
cumulative counters and add the step's differences. Imports verl lazily and no vLLM.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

from sam_rollout.metrics import METRIC_PREFIX, GenerationStepTracker, SamStepTracker
from sam_rollout.routing_metrics import RoutingStepTracker, store_hit_rate

logger = logging.getLogger(__name__)

_MARK = "__sam_spec_wrapped__"
RPC_TIMEOUT_S = 60.0

# SAM replicas alive in this process (the trainer's), whose servers are asked for counters.
_live_replicas: weakref.WeakSet[Any] = weakref.WeakSet()
_tracker = SamStepTracker()
_routers: list[Any] = []  # rollout routers built in this process (handles of Ray actors)
_routing_tracker = RoutingStepTracker()
_generation_tracker = GenerationStepTracker()
ROUTER_FACTORY_MODULE = "verl.workers.rollout.router"


def track_replica(replica: Any) -> None:
    """Called by SamvLLMReplica.__init__: its servers are polled for SAM counters each step."""
    _live_replicas.add(replica)


def wrap() -> None:
    """Wrap verl's ``Tracking.log`` and its router factory (idempotent)."""
    from verl.utils.tracking import Tracking

    track_routers()
    if getattr(Tracking.log, _MARK, False):
        return
    original = Tracking.log

    def log(self, data, step, *args, **kwargs):
        if is_training_step(data):
            data = {**data, **_tracker.step_metrics(poll_replicas())}
            data |= _routing_tracker.step_metrics(poll_router())
            end_router_step()
            data |= _generation_tracker.step_metrics(poll_generated_tokens(), data.get("timing_s/gen"))
            data |= store_hit_rate(data)
            print(step_summary(step, data), flush=True)
        return original(self, data, step, *args, **kwargs)

    setattr(log, _MARK, True)
    log.__wrapped__ = original
    Tracking.log = log


def track_routers() -> None:
    """Keep the handle of every router verl builds here: verl's rollout server manager imports
    ``get_router_handle`` from its module when it builds the router, so the module's name is wrapped."""
    import verl.workers.rollout.router as router_module

    original = router_module.get_router_handle
    if getattr(original, _MARK, False):
        return

    def get_router_handle(*args, **kwargs):
        handle = original(*args, **kwargs)
        _routers.append(handle)
        servers = kwargs.get("servers", args[0] if args else None)
        _never_raise(name_ring, handle, servers or {})
        return handle

    setattr(get_router_handle, _MARK, True)
    get_router_handle.__wrapped__ = original
    router_module.get_router_handle = get_router_handle


def ring_names(servers: Mapping[str, Any]) -> dict[str, str]:
    """{server address: the replica's key (role_rank + name suffix)} for the servers of live replicas: a
    name that is the same after a restart, whatever order and addresses the servers have then."""
    by_address = {getattr(r, "_server_address", None): r.sam_key for r in list(_live_replicas)}
    return {address: by_address[address] for address in servers if address in by_address}


def name_ring(handle, servers: Mapping[str, Any]) -> None:
    """Tell our router (where it is ours) which replica each server is, before any request comes."""
    import ray

    if getattr(handle, "set_ring_names", None) is None:  # verl's default router: no ring
        return
    names = ring_names(servers)
    named = ray.get(handle.set_ring_names.remote(names), timeout=RPC_TIMEOUT_S)
    if named["by_order"]:
        print(
            f"[sam] note: router replicas {named['by_order']} not matched to a replica key; their ring places "
            "follow the order verl lists them in (a restart keeps them only if that order is kept)",
            flush=True,
        )


def _never_raise(step, *args) -> None:
    try:
        step(*args)
    except Exception as e:  # routing stays correct without names: by order
        print(f"[sam] note: router replicas named by order: {type(e).__name__}: {e}", flush=True)


SUMMARY = (  # (label, metric key, format): what an RL user looks at first, one line per step
    ("reward", "critic/score/mean", "{:.3f}"),
    ("rollout s", "timing_s/gen", "{:.1f}"),
    ("step s", "timing_s/step", "{:.1f}"),
    ("response tokens", "response_length/mean", "{:.1f}"),
    ("requests", "rollout/requests", "{:.0f}"),
    ("SAM acceptance", f"{METRIC_PREFIX}acceptance_length", "{:.2f}"),
    ("speculation on", f"{METRIC_PREFIX}spec_on_fraction", "{:.0%}"),
    ("group co-location", "rollout/route_group_colocation", "{:.2f}"),
    ("store hits", f"{METRIC_PREFIX}store_hit_rate", "{:.2f}"),
)


def step_summary(step, data: Mapping[str, Any]) -> str:
    """``[sam] step 3: reward 0.250, rollout s 64.5, ...``; metrics a run does not have are left out."""
    parts = [f"{label} {fmt.format(data[key])}" for label, key, fmt in SUMMARY if key in data]
    return f"[sam] step {step}: " + ", ".join(parts)


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


def poll_generated_tokens() -> dict[str, int]:
    """Response tokens generated so far by every live rollout replica (SAM on or off)."""
    import ray

    rollout = [r for r in list(_live_replicas) if r.servers and r.sam_key.startswith("rollout_")]
    refs = {r.sam_key: [s.generated_tokens.remote() for s in r.servers] for r in rollout}
    out = {}
    for key, server_refs in refs.items():
        try:
            out[key] = sum(ray.get(server_refs, timeout=RPC_TIMEOUT_S))
        except Exception as e:  # metrics must never stop training
            logger.warning("generated tokens of %s unavailable: %s", key, e)
    return out


def rollout_router():
    """The handle of our router for the rollout (the newest built here: a teacher's comes earlier), or None
    where verl's default router runs."""
    for handle in reversed(_routers):
        if getattr(handle, "routing_stats", None) is not None:
            return handle
    return None


def end_router_step() -> None:
    """Tell the rollout router, where it is ours, that a training step ended: the step's peak requests in
    flight are the next batch's expected size (its DAPO refills may have run after the batch drained)."""
    import ray

    handle = rollout_router()
    if handle is None:
        return
    try:
        ray.get(handle.end_step.remote(), timeout=RPC_TIMEOUT_S)
    except Exception as e:  # routing stays correct without it: the bound keeps the largest peak
        logger.warning("router step end not delivered: %s", e)


def poll_router():
    """The routing counters of the rollout router, where it is ours (verl's default has none)."""
    import ray

    handle = rollout_router()
    if handle is None:
        return None
    try:
        return ray.get(handle.routing_stats.remote(), timeout=RPC_TIMEOUT_S)
    except Exception as e:  # metrics must never stop training
        logger.warning("routing metrics unavailable: %s", e)
        return None
