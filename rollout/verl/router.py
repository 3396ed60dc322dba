"""Prompt-affinity routing across verl's rollout replicas: a verl 0.9.1 router plugin.

SAM drafts from a request's GRPO siblings and from its prompt's earlier visits (the prompt store), and
both live inside one engine. verl's default balancer routes each request by its own id to the
least-loaded replica, which spreads a group over the replicas and sends a revisit anywhere.
``SamLoadBalancer`` keys the route on the prompt instead, the key the drafter's store uses:

- consistent hashing with bounded load: a prompt's group goes to the first replica on a hash ring
  (virtual nodes per replica, named by replica order, so a restart keeps the ring) whose in-flight
  requests, with the group added, stay within ``load_bound`` x the mean (of the batch being routed,
  taken from the last batch's peak while the new one arrives); a replica over its bound
  passes the group on along the ring, and when none fits the least loaded takes it. Replicas that
  served the prompt before (and so hold its stored responses) are tried first;
- siblings follow their group: a request whose group has members in flight joins them;
- verl's own behaviour is kept (a subclass of its ``GlobalRequestLoadBalancer``): stickiness per
  request id, elastic ``add_servers``/``remove_servers``, status and in-flight accounting.

``policy: least_loaded`` routes exactly as verl's default does and only measures (the baseline arm),
so both arms report the same routing metrics. verl builds the balancer from a YAML named by
``actor_rollout_ref.rollout.router_config_path`` (configs/router/): ``ray.remote(cls).remote(servers,
yaml_dict)``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from verl.workers.rollout.router import GlobalRequestLoadBalancer

from sam.prompt_store import prompt_key

PROMPT_AFFINITY = "prompt_affinity"
LEAST_LOADED = "least_loaded"
POLICIES = (PROMPT_AFFINITY, LEAST_LOADED)
ROUTER_CLASS_KEY = "router_class"  # verl's own key in the YAML
ROUTER_STATE_FORMAT = 1  # save_state's file


@dataclass(frozen=True)
class RouterSettings:
    """policy: prompt_affinity, or least_loaded (verl's default routing, measured).
    load_bound: a replica takes a new group only while its in-flight requests, with the group, stay
        within load_bound x the mean over replicas (>= 1; 1.25 is the issue's target spread).
    virtual_nodes: ring points per replica (more: a more even share of prompts per replica).
    prompt_memory: prompts remembered (LRU) with the replicas that served them: where their stored
        responses are, for routing and for the revisit metrics.
    """

    policy: str = PROMPT_AFFINITY
    load_bound: float = 1.25
    virtual_nodes: int = 64
    prompt_memory: int = 200_000

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {list(POLICIES)}, got {self.policy!r}")
        b = self.load_bound
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b >= 1.0:
            raise ValueError(f"router load_bound must be a number >= 1, got {b!r}")
        for name in ("virtual_nodes", "prompt_memory"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"router {name} must be an integer >= 1, got {v!r}")

    @classmethod
    def from_yaml_dict(cls, raw: Mapping[str, Any] | None) -> RouterSettings:
        """The router YAML as verl passes it (``router_class`` is verl's; every other key is ours)."""
        raw = {k: v for k, v in (raw or {}).items() if k != ROUTER_CLASS_KEY}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"router config: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**raw)


def _ring_point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Replicas on a ring of 64-bit points; ``walk(point)`` lists the replicas from that point on."""

    def __init__(self, virtual_nodes: int) -> None:
        self.virtual_nodes = virtual_nodes
        self._points: list[int] = []
        self._owners: list[str] = []

    def __contains__(self, server_id: str) -> bool:
        return server_id in self._owners

    def add(self, server_id: str, ring_name: str) -> None:
        if server_id in self:
            return
        for v in range(self.virtual_nodes):
            point = _ring_point(f"{ring_name}#{v}")
            i = bisect.bisect_left(self._points, point)
            self._points.insert(i, point)
            self._owners.insert(i, server_id)

    def remove(self, server_id: str) -> None:
        keep = [i for i, owner in enumerate(self._owners) if owner != server_id]
        self._points = [self._points[i] for i in keep]
        self._owners = [self._owners[i] for i in keep]

    def walk(self, point: int) -> list[str]:
        """Distinct replicas clockwise from ``point``."""
        n = len(self._points)
        start = bisect.bisect_left(self._points, point)
        order: list[str] = []
        for j in range(n):
            owner = self._owners[(start + j) % n]
            if owner not in order:
                order.append(owner)
        return order


@dataclass
class _Group:
    """One visit of a prompt: its requests in flight and all it placed, per replica, and where its
    earlier visits ran (``_served``'s entry at the visit's start; empty on a first visit)."""

    on_server: dict[str, int]
    placed: dict[str, int]
    earlier: dict[str, int]

    @property
    def inflight(self) -> int:
        return sum(self.on_server.values())


@dataclass
class RoutingCounters:
    """Cumulative since the balancer started; ``routing_stats`` reports them and the step's peaks."""

    requests: int = 0  # acquires (a multi-turn request counts each turn)
    keyed_requests: int = 0  # acquires that carried the prompt
    sibling_observations: int = 0  # acquires that found siblings of their group in flight
    colocated_share_sum: float = 0.0  # sum over those of the share of siblings on the same replica
    revisit_requests: int = 0  # acquires of a prompt whose earlier visit ended
    # over those, the sum of the share of the prompt's last visit that ran on the chosen replica (where
    # its stored responses are): 1.0 each when a group returns whole to its replica
    revisit_store_share_sum: float = 0.0
    overflowed_groups: int = 0  # groups passed on along the ring by the load bound


class SamLoadBalancer(GlobalRequestLoadBalancer):
    """verl's sticky, least-in-flight balancer, routing by prompt (see the module docstring)."""

    def __init__(self, servers: dict[str, Any], config: Mapping[str, Any] | None = None):
        super().__init__(servers)
        self.settings = RouterSettings.from_yaml_dict(config)
        self._ring = HashRing(self.settings.virtual_nodes)
        self._ring_names: dict[str, str] = {}
        self._groups: dict[bytes, _Group] = {}  # prompts with requests in flight
        # prompt -> {replica: requests of its last visit there}; replicas of older visits stay with 0
        self._served: OrderedDict[bytes, dict[str, int]] = OrderedDict()
        self._inflight_by_request: dict[str, tuple[bytes | None, str]] = {}
        self._largest_group = 1  # the most requests of one visit seen in flight: a group's expected size
        self._burst_peak = 0  # the most requests in flight since the replicas were last all idle
        self._last_burst_peak = 0  # the same, for the last burst (a rollout batch) that ended
        self._requests_by_server: dict[str, int] = {}
        self._peak_by_server: dict[str, int] = {}
        self.counters = RoutingCounters()
        self._join_ring(servers)

    # -- verl's protocol -----------------------------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(self, request_id: str, prompt_ids=None, **extra) -> tuple[str, Any]:
        key = None if prompt_ids is None else prompt_key(np.asarray(prompt_ids, dtype=np.int32))
        sticky = self._request_id_to_server.get(request_id)
        if self.settings.policy == LEAST_LOADED or key is None or sticky in self._inflight_requests:
            server_id, handle = super().acquire_server(request_id)
        else:
            server_id = self._choose(key)
            self._request_id_to_server[request_id] = server_id
            self._inflight_requests[server_id] += 1
            handle = self._servers[server_id]
        self._observe_start(request_id, key, server_id)
        return server_id, handle

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        super().release_server(server_id, request_id)
        if self._burst_peak and not self.get_total_inflight():
            self._last_burst_peak, self._burst_peak = self._burst_peak, 0
        key, _ = self._inflight_by_request.pop(request_id, (None, server_id))
        group = self._groups.get(key) if key is not None else None
        if group is None:
            return
        left = group.on_server.get(server_id, 0) - 1
        if left > 0:
            group.on_server[server_id] = left
        else:
            group.on_server.pop(server_id, None)
        if not group.on_server:  # the visit ended: its placement is where the prompt's store is now
            del self._groups[key]
            self._remember(key, group.placed)

    def add_servers(self, servers: dict[str, Any]) -> None:
        super().add_servers(servers)
        self._join_ring(servers)

    def remove_servers(self, server_ids: list[str]) -> None:
        super().remove_servers(server_ids)
        for sid in server_ids:
            self._ring.remove(sid)
            self._requests_by_server.pop(sid, None)
            self._peak_by_server.pop(sid, None)

    def get_status(self) -> dict:
        status = super().get_status()
        status["policy"] = self.settings.policy
        status["ring_names"] = {sid: self._ring_names[sid] for sid in self._inflight_requests}
        status["groups_in_flight"] = len(self._groups)
        return status

    # -- metrics -------------------------------------------------------------------------------
    def routing_stats(self, reset_peaks: bool = False) -> dict:
        """Cumulative counters, requests per replica, and each replica's peak in-flight requests since
        the last reset (a training step's, when the tracker resets them once per step)."""
        stats = {f.name: getattr(self.counters, f.name) for f in fields(RoutingCounters)}
        stats["policy"] = self.settings.policy
        stats["requests_by_server"] = dict(self._requests_by_server)
        stats["peak_inflight_by_server"] = dict(self._peak_by_server)
        if reset_peaks:
            self._peak_by_server = dict(self._inflight_requests)
        return stats

    # -- state across a restart ----------------------------------------------------------------
    def save_state(self, path: str) -> int:
        """Write which replicas served each remembered prompt (by ring name, i.e. replica rank: a
        restarted run's servers have new addresses) to ``path``, atomically; returns the prompts written.
        Saved beside the prompt stores, so a resumed run sends a prompt where its stored responses are."""
        state = {
            "format": ROUTER_STATE_FORMAT,
            "served": {
                key.hex(): {self._ring_names[s]: n for s, n in served.items()} for key, served in self._served.items()
            },
        }
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            json.dump(state, f)
        os.replace(f.name, path)
        return len(state["served"])

    def load_state(self, path: str) -> dict:
        """Read ``save_state``'s file; replicas are matched by ring name. A missing, unreadable or
        other-format file leaves the memory empty and says why (routing stays correct without it)."""
        try:
            with open(path) as f:
                state = json.load(f)
            if not isinstance(state, dict) or state.get("format") != ROUTER_STATE_FORMAT:
                raise ValueError(f"format {state.get('format') if isinstance(state, dict) else None!r}, "
                                 f"expected {ROUTER_STATE_FORMAT}")  # fmt: skip
            by_name = {name: sid for sid, name in self._ring_names.items() if sid in self._inflight_requests}
            served = {
                bytes.fromhex(key): {by_name[name]: int(n) for name, n in names.items() if name in by_name}
                for key, names in state["served"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return {"prompts": 0, "warning": f"{path}: {type(e).__name__}: {e}"}
        for key, sids in served.items():
            if sids:
                self._served[key] = sids
        while len(self._served) > self.settings.prompt_memory:
            self._served.popitem(last=False)
        return {"prompts": len(self._served), "warning": None}

    # -- routing -------------------------------------------------------------------------------
    def _join_ring(self, servers: Mapping[str, Any]) -> None:
        """Ring names by replica order (verl passes its servers in replica-rank order), so a restarted
        run, whose servers have new addresses, puts each prompt on the same replica rank."""
        for sid in servers:
            self._ring_names.setdefault(sid, f"replica-{len(self._ring_names)}")
            self._ring.add(sid, self._ring_names[sid])
            self._requests_by_server.setdefault(sid, 0)
            self._peak_by_server.setdefault(sid, 0)

    def _choose(self, key: bytes) -> str:
        if not self._inflight_requests:
            raise RuntimeError("No available servers in load balancer")
        group = self._groups.get(key)
        if group is not None:  # siblings follow their group
            live = [sid for sid in group.on_server if sid in self._inflight_requests]
            if live:
                return max(live, key=lambda sid: group.on_server[sid])
        order = self._preference(key)
        size = self._largest_group
        # the mean of the batch being routed: at its start only a few of its groups are in flight, so
        # the last batch's peak stands in for it (else the first groups would be spread by load alone)
        total = max(sum(self._inflight_requests.values()) + size, self._last_burst_peak)
        bound = self.settings.load_bound * total / len(self._inflight_requests)
        for sid in order:
            if self._inflight_requests[sid] + size <= math.ceil(bound - 1e-9):
                if sid != order[0]:
                    self.counters.overflowed_groups += 1
                return sid
        self.counters.overflowed_groups += 1
        return min(order, key=lambda sid: self._inflight_requests[sid])  # ring order breaks ties

    def _preference(self, key: bytes) -> list[str]:
        """Replicas in the order this prompt's group tries them: those that served its earlier visits
        (they hold its stored responses), most of its last visit first, then the rest, in ring order from
        the prompt's point."""
        order = self._ring.walk(int.from_bytes(key[:8], "big"))
        served = self._served.get(key, {})
        rank = {sid: i for i, sid in enumerate(order)}
        first = sorted((sid for sid in order if sid in served), key=lambda sid: (-served[sid], rank[sid]))
        return first + [sid for sid in order if sid not in served]

    def _observe_start(self, request_id: str, key: bytes | None, server_id: str) -> None:
        c = self.counters
        c.requests += 1
        self._requests_by_server[server_id] = self._requests_by_server.get(server_id, 0) + 1
        self._peak_by_server[server_id] = max(
            self._peak_by_server.get(server_id, 0), self._inflight_requests.get(server_id, 0)
        )
        self._inflight_by_request[request_id] = (key, server_id)
        self._burst_peak = max(self._burst_peak, self.get_total_inflight())
        if key is None:
            return
        c.keyed_requests += 1
        group = self._groups.get(key)
        if group is None:  # a new visit of this prompt
            group = self._groups[key] = _Group(on_server={}, placed={}, earlier=dict(self._served.get(key, {})))
        else:
            c.sibling_observations += 1
            c.colocated_share_sum += group.on_server.get(server_id, 0) / group.inflight
        last_visit = sum(group.earlier.values())
        if last_visit:
            c.revisit_requests += 1
            c.revisit_store_share_sum += group.earlier.get(server_id, 0) / last_visit
        group.on_server[server_id] = group.on_server.get(server_id, 0) + 1
        group.placed[server_id] = group.placed.get(server_id, 0) + 1
        self._largest_group = max(self._largest_group, group.inflight)

    def _remember(self, key: bytes, placed: dict[str, int]) -> None:
        """A visit ended: its replicas hold the prompt's newest responses; earlier ones keep older ones."""
        served = dict.fromkeys(self._served.pop(key, {}), 0) | placed
        self._served[key] = served
        while len(self._served) > self.settings.prompt_memory:
            self._served.popitem(last=False)
