"""Prompt-affinity routing across verl's rollout replicas: a verl 0.9.1 router plugin.

SAM drafts from a request's GRPO siblings and from its prompt's earlier visits (the prompt store), and
both live inside one engine. verl's default balancer routes each request by its own id to the
least-loaded replica, which spreads a group over the replicas and sends a revisit anywhere.
``SamLoadBalancer`` keys the route on the prompt instead, the key the drafter's store uses:

- a prompt's group is placed when its first request arrives, and its siblings join it: with store
  handoffs in chunks of ``group_chunk`` requests (4 by default), each chunk placed as a group is, so that
  one prompt's samples, whose lengths go together, do not all land on one replica; else whole;
- with store handoffs (``store_handoff``, the default), replicas are tried least in-flight work first,
  a replica holding the prompt's stored responses ahead while its work is within half the chunk's
  (``STORE_PREFERENCE``) of the least loaded. A returning group's chunk placed off the replicas holding
  its prompt's store takes the store along: before its first request leaves the router, the prompt's
  responses are copied to the chosen replica (``sam_rollout.verl.runtime.store_handoff``), so balance
  costs no store;
- without (``store_handoff: false``), replicas that served the prompt before are tried first, then the
  others in the order of a consistent-hash ring (virtual nodes per replica, named by the replica's
  identity, so a restart whose servers come in another order with new addresses keeps the ring; the
  ring also breaks ties in work). A replica holding the prompt's store is then judged in requests
  alone: it takes the group while its in-flight requests with the group stay within ``load_bound`` x
  the batch's expected requests per replica. That limit only grows while a batch arrives and reads no
  timing, so whether a group goes back to its store depends neither on the order the batch's requests
  arrive in nor on the seconds its prompt's last visit happened to take (latency under whatever else
  ran then). The group counts as no larger than the newest group (a DAPO refill of a prompt whose group
  still runs joins that group, and the visit is remembered twice as large);
- load is counted in work: each in-flight request weighs what one request of its prompt cost at the
  prompt's last visit (seconds from acquire to release, as the router sees them), or the running mean
  cost for a prompt not seen yet. A replica takes a new group while its in-flight work with the group
  stays within ``load_bound`` x the mean work expected for the batch being routed, and never more than
  one group above ``load_bound`` x the mean of what is in flight now; else the group goes on along the
  order, and when no replica fits the least loaded takes it (docs/metrics.md, "the load bound");
- the batch being routed is expected to hold as many requests as the last training step's peak in
  flight (the trainer's metrics hook calls ``end_step``: a step's DAPO refills can run after its batch
  drained, and are no batch). What the bound learned is saved with the router state, so a resumed
  router bounds as an uninterrupted one. A group is expected as large as its prompt's last visit, or
  as the newest group;
- a trajectory is one request of its prompt: verl sends every turn of a multi-turn trajectory, and
  every resume of an aborted partial rollout, under the trajectory's request id with a prompt that
  extends the first one (prompt + responses so far + tool outputs). Such an acquire continues the
  trajectory: it keeps the first prompt's key (and its replica: verl's stickiness, or the key's route
  after verl cleared it) and counts neither as a new request of the prompt nor as a revisit. The
  request id alone does not decide it (verl's ``full_determinism`` reuses ``det-<i>`` every step), and
  neither does a shared prefix alone (prompts share a system prompt): both must hold;
- verl's own behaviour is kept (a subclass of its ``GlobalRequestLoadBalancer``): stickiness per
  request id, elastic ``add_servers``/``remove_servers``, status and in-flight accounting.

``policy: least_loaded`` routes exactly as verl's default does and only measures (the baseline arm),
so both arms report the same routing metrics. verl builds the balancer from a YAML named by
``actor_rollout_ref.rollout.router_config_path`` (configs/router/): ``ray.remote(cls).remote(servers,
yaml_dict)``; ``sam_rollout.verl.runtime.tracking`` then names its replicas (``set_ring_names``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from verl.workers.rollout.router import GlobalRequestLoadBalancer

from sam_rollout.drafter.prompt_store import prompt_key
from sam_rollout.verl.runtime.store_handoff import RayStoreHandoff

logger = logging.getLogger(__name__)

PROMPT_AFFINITY = "prompt_affinity"
LEAST_LOADED = "least_loaded"
POLICIES = (PROMPT_AFFINITY, LEAST_LOADED)
ROUTER_CLASS_KEY = "router_class"  # verl's own key in the YAML
# save_state's file. 2: replicas by their identity (set_ring_names), each prompt's request cost, and
# what the load bound learned (the batch's requests, the mean request cost, the newest group's size)
ROUTER_STATE_FORMAT = 2
# the ring is built with virtual_nodes x replicas hashes and list inserts when the router starts and
# at every add_servers: 4096 x 32 replicas is about a second; more spreads prompts no more evenly
MAX_VIRTUAL_NODES = 4096
# a request counts as costing at least this (seconds in flight): below it, timing noise (or a test's
# instant release) would weigh prompts at random
REQUEST_COST_FLOOR_S = 0.05
COST_AVERAGING = 1 / 64  # weight of each released request in the running mean request cost
# groups a replica may hold above load_bound x the mean of what is in flight now. The expected batch
# (the last step's) lets groups whose stores share a replica arrive together early in a batch;
# a batch smaller than the last one looks the same until it ends, so this caps what it can gather on
# one replica: at most one group above the bound (benchmarks/routing.py: 1 group costs 2-7 points of
# store share at 32B and 235B against 2 groups, and keeps 8 groups of 8 after a 64 x 8 batch within 1.5)
GROUP_SLACK = 1
# with store handoffs, a replica holding the prompt's store is chosen while its in-flight work is within
# this many of the group's works of the least loaded replica's; further off, the least loaded takes the
# group and a copy of the store. simulate_rollout --cluster --cluster-bounds, later epochs: 0.5 copies 38%
# (32B) and 55% (235B) of the returning groups, at 0.725x and 0.786x; 0 (least loaded alone, an exploratory
# run not kept) copied 74% and 96%, at 0.733x and 0.785x
STORE_PREFERENCE = 0.5
# trajectories remembered (LRU, each refreshed by its turns) to recognise their next turn: above the
# requests of a rollout batch (verl's own sticky cache holds 10,000), about 250 bytes each
TRAJECTORY_MEMORY = 100_000


@dataclass(frozen=True)
class RouterSettings:
    """policy: prompt_affinity, or least_loaded (verl's default routing, measured).
    load_bound: a replica takes a new group only while its in-flight work, with the group, stays
        within load_bound x the mean over replicas (a finite number >= 1; 1.25 is the issue's target).
    virtual_nodes: ring points per replica (more: a more even share of prompts per replica), at most
        MAX_VIRTUAL_NODES.
    prompt_memory: prompts remembered (LRU) with the replicas that served them and their cost: where
        their stored responses are, for routing and for the revisit metrics.
    store_handoff: replicas are tried least loaded first, and a returning group placed off its store's
        replicas takes the store with it (copied to the chosen replica); false: the store stays, its
        replicas are tried first and judged in requests (module docstring).
    group_chunk: with store handoffs, the most requests of one group placed together: the group's next
        request opens a new chunk, placed as a group is (least loaded first) and given its own copy of
        the store. 0: whole groups (siblings always join their group), as always without handoffs (a
        chunk off the store's replicas would run without the store). The default 4 was chosen on the
        cluster simulator (benchmarks/group_chunk.py): a prompt's samples have correlated lengths, and
        whole groups of 16 gathered a new prompt's long samples on one replica.
    """

    policy: str = PROMPT_AFFINITY
    load_bound: float = 1.25
    virtual_nodes: int = 64
    prompt_memory: int = 200_000
    store_handoff: bool = True
    group_chunk: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {list(POLICIES)}, got {self.policy!r}")
        b = self.load_bound
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not b >= 1.0:
            raise ValueError(f"router load_bound must be a finite number >= 1, got {b!r}")
        for name in ("virtual_nodes", "prompt_memory"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"router {name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.store_handoff, bool):
            raise ValueError(f"router store_handoff must be true or false, got {self.store_handoff!r}")
        c = self.group_chunk
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"router group_chunk must be an integer >= 0 (0: whole groups), got {c!r}")
        if self.virtual_nodes > MAX_VIRTUAL_NODES:
            raise ValueError(
                f"router virtual_nodes must be at most {MAX_VIRTUAL_NODES}, got {self.virtual_nodes}: the ring "
                "is built from virtual_nodes x replicas points at start, and more points spread prompts no more evenly"
            )

    @classmethod
    def from_yaml_dict(cls, raw: Mapping[str, Any] | None) -> RouterSettings:
        """The router YAML as verl passes it (``router_class`` is verl's; every other key is ours)."""
        raw = dict(raw or {})
        router_class = raw.pop(ROUTER_CLASS_KEY, None)
        if router_class is not None and not isinstance(router_class, str):
            raise ValueError(f"router_class must be a qualified class name (a string), got {router_class!r}")
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
class _Memory:
    """A prompt's past: {replica: requests of its last visit there} (replicas of older visits kept with
    0: they hold older responses) and what one request of its last visit cost (seconds in flight)."""

    placed: dict[str, int]
    request_cost: float

    @property
    def last_visit(self) -> int:
        return sum(self.placed.values())


@dataclass
class _Group:
    """One visit of a prompt: its requests in flight and all it placed, per replica, where its earlier
    visits ran (``_served``'s entry at the visit's start; empty on a first visit), and the cost of its
    released requests."""

    on_server: dict[str, int]
    placed: dict[str, int]
    earlier: dict[str, int]
    released_cost: float = 0.0
    released: int = 0
    copied: dict[str, int] = field(default_factory=dict)  # replica -> last-visit responses copied there
    chunk_server: str | None = None  # with group_chunk: the replica of the group's open chunk
    chunk_placed: int = 0  # and the requests placed in it

    @property
    def inflight(self) -> int:
        return sum(self.on_server.values())


@dataclass
class _Trajectory:
    """What a request id's first acquire carried: its prompt's key and length, and the visit it joined."""

    key: bytes
    prompt_length: int
    group: _Group


@dataclass
class _Flight:
    """A request in flight: its prompt (None: it carried none), replica, weight, start time, and the
    visit whose in-flight requests it counts in (None: none, e.g. a continuation after its visit ended)."""

    key: bytes | None
    server: str
    cost: float
    started: float
    group: _Group | None = None


@dataclass
class RoutingCounters:
    """Cumulative since the balancer started; ``routing_stats`` reports them (docs/metrics.md)."""

    requests: int = 0  # acquires (a multi-turn trajectory counts each turn)
    continued_requests: int = 0  # of those, continuations (a later turn, a resumed partial rollout)
    keyed_requests: int = 0  # the others that carried the prompt: one per trajectory
    sibling_observations: int = 0  # acquires that found siblings of their group in flight
    colocated_share_sum: float = 0.0  # sum over those of the share of siblings on the same replica
    revisit_requests: int = 0  # acquires of a prompt whose earlier visit ended
    # over those, the sum of the share of the prompt's last visit that ran on the chosen replica (where
    # its stored responses are): 1.0 each when a group returns whole to its replica
    revisit_store_share_sum: float = 0.0
    # over those, the same share counting what a store handoff copied to the chosen replica
    revisit_store_available_sum: float = 0.0
    overflowed_groups: int = 0  # groups placed elsewhere than their first choice by the load bound
    store_handoffs: int = 0  # copies of a prompt's store to a replica a visit placed requests on
    store_handoff_failures: int = 0  # copies that failed (those requests ran without the store)
    store_handoff_seconds: float = 0.0  # the router's time waiting for copies
    # the replicas' simultaneous load over time, between routing events: the integrals over time of the
    # most loaded replica's in-flight requests and of the mean over replicas (request-seconds), and the
    # same in work (in-flight request costs, cost-seconds)
    load_max_integral: float = 0.0
    load_mean_integral: float = 0.0
    work_max_integral: float = 0.0
    work_mean_integral: float = 0.0


@dataclass
class BoundEstimates:
    """What the load bound learned, kept across a restart (save_state): the last training step's peak
    requests in flight (the batch being routed is expected to be as large), the running mean request
    cost (the weight of a prompt not seen yet), and the newest group's size (a new prompt's expected
    group)."""

    batch_requests: int = 0
    request_cost: float = REQUEST_COST_FLOOR_S
    group_size: int = 1


@dataclass
class _Load:
    """In-flight work per replica, the current step's peak requests in flight, and the newest group."""

    work: dict[str, float] = field(default_factory=dict)
    step_requests: int = 0
    newest_group: bytes | None = None
    clock_at: float | None = None


class SamLoadBalancer(GlobalRequestLoadBalancer):
    """verl's sticky, least-in-flight balancer, routing by prompt (see the module docstring)."""

    def __init__(
        self,
        servers: dict[str, Any],
        config: Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        handoff: Callable[[bytes, list[Any], Any], bool] | None = None,
    ):
        """``handoff(key, source handles, target handle)`` copies a prompt's store and says whether it
        arrived (default: ``RayStoreHandoff``); used only with ``store_handoff`` and prompt affinity."""
        super().__init__(servers)
        self.settings = RouterSettings.from_yaml_dict(config)
        self._clock = clock
        moves = self.settings.store_handoff and self.settings.policy == PROMPT_AFFINITY
        self._handoff = (handoff or RayStoreHandoff()) if moves else None
        self._ring = HashRing(self.settings.virtual_nodes)
        self._ring_names: dict[str, str] = {}
        self._groups: dict[bytes, _Group] = {}  # prompts with requests in flight
        self._served: OrderedDict[bytes, _Memory] = OrderedDict()
        self._flights: dict[str, _Flight] = {}
        self._trajectories: OrderedDict[str, _Trajectory] = OrderedDict()
        self._load = _Load()
        self.estimates = BoundEstimates()
        self._requests_by_server: dict[str, int] = {}
        self.counters = RoutingCounters()
        self._join_ring(servers)

    # -- verl's protocol -----------------------------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(self, request_id: str, prompt_ids=None, **extra) -> tuple[str, Any]:
        now = self._advance_clock()
        ids = None if prompt_ids is None else np.asarray(prompt_ids, dtype=np.int32)
        trajectory = self._continued(request_id, ids)
        key = trajectory.key if trajectory is not None else None if ids is None else prompt_key(ids)
        sticky = self._request_id_to_server.get(request_id)
        if self.settings.policy == LEAST_LOADED or key is None or sticky in self._inflight_requests:
            server_id, handle = super().acquire_server(request_id)
        else:  # a continuation whose stickiness verl cleared goes where its prompt's key leads
            server_id = self._choose(key, placing_group=trajectory is None)
            self._request_id_to_server[request_id] = server_id
            self._inflight_requests[server_id] += 1
            handle = self._servers[server_id]
        if trajectory is not None:
            self._observe_continuation(request_id, trajectory, server_id, now)
        else:
            self._observe_start(request_id, key, server_id, now, prompt_length=0 if ids is None else len(ids))
        return server_id, handle

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        now = self._advance_clock()
        super().release_server(server_id, request_id)
        flight = self._flights.pop(request_id, None)
        if flight is not None and flight.server in self._load.work:
            self._load.work[flight.server] = max(0.0, self._load.work[flight.server] - flight.cost)
        if flight is None:
            return
        cost = max(now - flight.started, REQUEST_COST_FLOOR_S)
        e = self.estimates
        e.request_cost += COST_AVERAGING * (cost - e.request_cost)
        group = flight.group
        if group is None:
            return
        group.released_cost += cost
        group.released += 1
        left = group.on_server.get(flight.server, 0) - 1
        if left > 0:
            group.on_server[flight.server] = left
        else:
            group.on_server.pop(flight.server, None)
        if not group.on_server:  # the visit ended: its placement is where the prompt's store is now
            del self._groups[flight.key]
            self._remember(flight.key, group.placed, group.released_cost / group.released)

    def add_servers(self, servers: dict[str, Any]) -> None:
        self._advance_clock()
        super().add_servers(servers)
        self._join_ring(servers)

    def remove_servers(self, server_ids: list[str]) -> None:
        self._advance_clock()
        super().remove_servers(server_ids)
        for sid in server_ids:
            self._ring.remove(sid)
            self._requests_by_server.pop(sid, None)
            self._load.work.pop(sid, None)

    def get_status(self) -> dict:
        status = super().get_status()
        status["policy"] = self.settings.policy
        status["ring_names"] = {sid: self._ring_names[sid] for sid in self._inflight_requests}
        status["groups_in_flight"] = len(self._groups)
        return status

    def end_step(self) -> int:
        """A training step ended (the trainer's metrics hook says so): its peak requests in flight are the
        next batch's expected size. A step's DAPO refills can run after its batch drained, in busy periods
        of their own; the step's peak is its batch. Returns that peak."""
        peak = self._load.step_requests
        if peak:
            self.estimates.batch_requests = peak
        self._load.step_requests = self.get_total_inflight()  # an asynchronous rollout runs on
        return peak

    # -- replica identity ------------------------------------------------------------------------
    def set_ring_names(self, names: Mapping[str, str]) -> dict:
        """Name each replica by its identity ({server address: stable name}, e.g. verl's replica key),
        so that the ring and the saved state survive a restart whose servers come in another order with
        new addresses. Servers not named keep their name by order; returns which those are."""
        given = {sid: str(name) for sid, name in names.items() if sid in self._inflight_requests}
        if len(set(given.values())) != len(given):
            raise ValueError(f"ring names must be unique, got {given}")
        by_order = {sid: n for sid, n in self._ring_names.items() if sid not in given}
        clash = sorted(set(by_order.values()) & set(given.values()))
        if clash:
            raise ValueError(f"ring names {clash} are already names of other replicas")
        for sid, name in given.items():
            self._ring.remove(sid)
            self._ring_names[sid] = name
            self._ring.add(sid, name)
        return {
            "named": sorted(given.values()),
            "by_order": sorted(s for s in self._inflight_requests if s not in given),
        }

    # -- metrics -------------------------------------------------------------------------------
    def routing_stats(self) -> dict:
        """Cumulative counters (the load integrals brought up to now) and requests per replica."""
        self._advance_clock()
        stats = {f.name: getattr(self.counters, f.name) for f in fields(RoutingCounters)}
        stats["policy"] = self.settings.policy
        stats["requests_by_server"] = dict(self._requests_by_server)
        return stats

    # -- state across a restart ----------------------------------------------------------------
    def save_state(self, path: str) -> int:
        """Write which replicas served each remembered prompt (by ring name: a restarted run's servers
        have new addresses), what one of its requests cost, and what the load bound learned, to ``path``,
        atomically; returns the prompts written. Saved beside the prompt stores, so a resumed run sends a
        prompt where its stored responses are, and bounds the load as the uninterrupted run would."""
        e = self.estimates
        state = {
            "format": ROUTER_STATE_FORMAT,
            "estimates": {
                "batch_requests": self._load.step_requests or e.batch_requests,  # mid-step: this step's
                "request_cost": e.request_cost,
                "group_size": e.group_size,
            },
            "served": {
                key.hex(): {
                    "replicas": {self._ring_names[s]: n for s, n in memory.placed.items() if s in self._ring_names},
                    "request_cost": memory.request_cost,
                }
                for key, memory in self._served.items()
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
            version = state.get("format") if isinstance(state, dict) else None
            if version != ROUTER_STATE_FORMAT:
                older = isinstance(version, int) and version < ROUTER_STATE_FORMAT
                raise ValueError(
                    f"format {version!r}, expected {ROUTER_STATE_FORMAT}"
                    + (" (a file of an older version: it names replicas by their order, not used)" if older else "")
                )
            by_name = {name: sid for sid, name in self._ring_names.items() if sid in self._inflight_requests}
            served = {
                bytes.fromhex(key): _Memory(
                    placed={by_name[name]: int(n) for name, n in entry["replicas"].items() if name in by_name},
                    request_cost=max(float(entry["request_cost"]), REQUEST_COST_FLOOR_S),
                )
                for key, entry in state["served"].items()
            }
            raw = state["estimates"]
            estimates = BoundEstimates(
                batch_requests=max(int(raw["batch_requests"]), 0),
                request_cost=max(float(raw["request_cost"]), REQUEST_COST_FLOOR_S),
                group_size=max(int(raw["group_size"]), 1),
            )
            if not all(math.isfinite(m.request_cost) for m in served.values()) or not math.isfinite(
                estimates.request_cost
            ):
                raise ValueError("a request cost is not finite")
            unknown = sorted({n for e in state["served"].values() for n in e["replicas"]} - set(by_name))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return {"prompts": 0, "warning": f"{path}: {type(e).__name__}: {e}"}
        for key, memory in served.items():
            if memory.placed:
                self._served[key] = memory
        while len(self._served) > self.settings.prompt_memory:
            self._served.popitem(last=False)
        self.estimates = estimates
        warning = None
        if unknown:  # their prompts route by the ring; the stores they name are not among this run's
            warning = f"{path}: replicas {unknown} of the saved state are not among this router's {sorted(by_name)}"
        return {"prompts": len(self._served), "warning": warning}

    # -- routing -------------------------------------------------------------------------------
    def _join_ring(self, servers: Mapping[str, Any]) -> None:
        """Ring names by replica order until ``set_ring_names`` names them by identity."""
        for sid in servers:
            if sid not in self._ring_names:
                taken = set(self._ring_names.values())
                name = next(f"replica-{i}" for i in range(len(taken) + 1) if f"replica-{i}" not in taken)
                self._ring_names[sid] = name
            self._ring.add(sid, self._ring_names[sid])
            self._requests_by_server.setdefault(sid, 0)
            self._load.work.setdefault(sid, 0.0)

    def _choose(self, key: bytes, placing_group: bool = True) -> str:
        """The replica for a request of this prompt: its group's while the group is in flight, else the
        first in the prompt's order within the load bound. ``placing_group`` False: a continuation, whose
        route off the first choice is not a group the bound passed on."""
        if not self._inflight_requests:
            raise RuntimeError("No available servers in load balancer")
        group = self._groups.get(key)
        if group is not None:  # siblings follow their group
            joined = self._sibling_replica(group)
            if joined is not None:
                return joined
        order = self._preference(key)
        bound, work, store_size, store_limit = self._bounds(key)
        memory = self._served.get(key)
        stored = {sid for sid, n in memory.placed.items() if n} if memory is not None else set()
        loads = self._load.work
        if self._stores_move:
            order, in_requests = self._by_load(order, stored, work), set()
        else:
            in_requests = stored  # a store that cannot move: judged in requests (the module docstring)
        for sid in order:
            if sid in in_requests:  # against the batch's limit (the module docstring says why)
                fits = self._inflight_requests[sid] + store_size <= store_limit * (1 + 1e-9)
            else:
                fits = loads.get(sid, 0.0) + work <= bound * (1 + 1e-9)
            if fits:
                chosen = sid
                break
        else:
            chosen = min(order, key=lambda sid: loads.get(sid, 0.0))  # ring order breaks ties
        if chosen != order[0] and placing_group:
            self.counters.overflowed_groups += 1
        return chosen

    def _sibling_replica(self, group: _Group) -> str | None:
        """Where a sibling of a group in flight goes: the replica holding most of the group's live
        requests; with group_chunk, its open chunk's while that has room (None: open a new chunk)."""
        chunk = self._chunk
        if chunk:
            open_chunk = group.chunk_server in self._inflight_requests and group.chunk_placed < chunk
            return group.chunk_server if open_chunk else None
        live = [sid for sid in group.on_server if sid in self._inflight_requests]
        return max(live, key=lambda sid: group.on_server[sid]) if live else None

    def _bounds(self, key: bytes) -> tuple[float, float, int, float]:
        """The most in-flight work a replica may hold with this prompt's group on it, the group's work, and
        for a replica holding the prompt's store, the group's requests and the most requests it may hold
        with them (no more than the newest group's: a visit a DAPO refill of its prompt joined is larger).
        The group is expected to be as large as the prompt's last visit (else the newest group), each
        request costing what one did then (else the running mean). The batch is expected to hold the last
        step's peak requests (at least what is in flight with the group), at the mean cost of what is in
        flight with the group: the work limit is the smaller of load_bound x that over the replicas and one
        group above load_bound x the mean of what is in flight now (which keeps a batch smaller than the
        last from gathering on a few replicas); the store's limit is load_bound x the batch's requests over
        the replicas."""
        memory = self._served.get(key)
        e = self.estimates
        size = memory.last_visit if memory is not None and memory.last_visit else e.group_size
        if self._chunk:  # a chunk is placed, not the whole group
            size = min(size, self._chunk)
        work = size * (memory.request_cost if memory is not None else e.request_cost)
        replicas = len(self._inflight_requests)
        now_work = sum(self._load.work.get(s, 0.0) for s in self._inflight_requests) + work
        now_requests = self.get_total_inflight() + size
        batch_requests = max(e.batch_requests, self._load.step_requests, now_requests)
        b = self.settings.load_bound
        batch_bound = b * now_work * batch_requests / now_requests / replicas
        bound = min(batch_bound, b * now_work / replicas + GROUP_SLACK * work)
        return bound, work, min(size, e.group_size), b * batch_requests / replicas

    @property
    def _stores_move(self) -> bool:
        """Store handoffs are on, and the servers have not turned out unable to make them."""
        return self._handoff is not None and getattr(self._handoff, "unsupported", None) is None

    @property
    def _chunk(self) -> int:
        """The most requests of a group placed together (0: whole groups): chunks need stores that move."""
        return self.settings.group_chunk if self._stores_move else 0

    def _by_load(self, order: list[str], stored: set[str], work: float) -> list[str]:
        """With store handoffs: least in-flight work first (``order`` breaks ties), and a replica holding
        the prompt's store ahead while its work is within STORE_PREFERENCE x the group's work of the
        least loaded (a copy is cheap, not free)."""
        loads = self._load.work
        by_load = sorted(order, key=lambda sid: loads.get(sid, 0.0))
        near = loads.get(by_load[0], 0.0) + STORE_PREFERENCE * work
        first = [sid for sid in by_load if sid in stored and loads.get(sid, 0.0) <= near * (1 + 1e-9)]
        return first + [sid for sid in by_load if sid not in first]

    def _preference(self, key: bytes) -> list[str]:
        """Replicas in the order this prompt's group tries them: those that served its earlier visits
        (they hold its stored responses), most of its last visit first, then the rest, in ring order from
        the prompt's point."""
        order = self._ring.walk(int.from_bytes(key[:8], "big"))
        memory = self._served.get(key)
        served = memory.placed if memory is not None else {}
        rank = {sid: i for i, sid in enumerate(order)}
        first = sorted((sid for sid in order if sid in served), key=lambda sid: (-served[sid], rank[sid]))
        return first + [sid for sid in order if sid not in served]

    def _continued(self, request_id: str, ids: np.ndarray | None) -> _Trajectory | None:
        """The trajectory this acquire continues: its request id's first acquire carried a prompt that
        this one's starts with, and this one is longer (a later turn, a resume with tokens) or that
        visit is still in flight (a resume before any token). Else None: a request of its own prompt."""
        trajectory = self._trajectories.get(request_id)
        if trajectory is None or ids is None or len(ids) < trajectory.prompt_length:
            return None
        in_flight = self._groups.get(trajectory.key) is trajectory.group
        if len(ids) == trajectory.prompt_length and not in_flight:
            return None
        if prompt_key(ids[: trajectory.prompt_length]) != trajectory.key:
            return None
        self._trajectories.move_to_end(request_id)
        return trajectory

    def _start_flight(self, request_id: str, key: bytes | None, server_id: str, now: float) -> _Flight:
        """Count an acquire on its replica and weigh it in the replica's in-flight work."""
        self.counters.requests += 1
        self._requests_by_server[server_id] = self._requests_by_server.get(server_id, 0) + 1
        memory = self._served.get(key) if key is not None else None
        cost = memory.request_cost if memory is not None else self.estimates.request_cost
        old = self._flights.pop(request_id, None)  # a sticky request's earlier turn still in flight
        if old is not None and old.server in self._load.work:
            self._load.work[old.server] = max(0.0, self._load.work[old.server] - old.cost)
        flight = self._flights[request_id] = _Flight(key, server_id, cost, now)
        self._load.work[server_id] = self._load.work.get(server_id, 0.0) + cost
        self._load.step_requests = max(self._load.step_requests, self.get_total_inflight())
        return flight

    def _observe_continuation(self, request_id: str, trajectory: _Trajectory, server_id: str, now: float) -> None:
        """A later turn or a resume: in flight with its visit while that visit is, never a new request
        of its prompt, a sibling observation or a revisit."""
        flight = self._start_flight(request_id, trajectory.key, server_id, now)
        self.counters.continued_requests += 1
        group = trajectory.group
        if self._groups.get(trajectory.key) is group:
            group.on_server[server_id] = group.on_server.get(server_id, 0) + 1
            flight.group = group

    def _observe_start(
        self, request_id: str, key: bytes | None, server_id: str, now: float, prompt_length: int
    ) -> None:
        flight = self._start_flight(request_id, key, server_id, now)
        if key is None:
            return
        c = self.counters
        memory = self._served.get(key)
        c.keyed_requests += 1
        group = self._groups.get(key)
        if group is None:  # a new visit of this prompt
            earlier = dict(memory.placed) if memory is not None else {}
            group = self._groups[key] = _Group(on_server={}, placed={}, earlier=earlier)
            self._load.newest_group = key
        else:
            c.sibling_observations += 1
            c.colocated_share_sum += group.on_server.get(server_id, 0) / group.inflight
        if server_id not in group.placed:  # the visit's first request here: its store comes along
            self._hand_off_store(key, group, server_id)
        if server_id != group.chunk_server:
            group.chunk_server, group.chunk_placed = server_id, 0
        group.chunk_placed += 1
        last_visit = sum(group.earlier.values())
        if last_visit:
            c.revisit_requests += 1
            here = group.earlier.get(server_id, 0)
            c.revisit_store_share_sum += here / last_visit
            c.revisit_store_available_sum += (here + group.copied.get(server_id, 0)) / last_visit
        group.on_server[server_id] = group.on_server.get(server_id, 0) + 1
        group.placed[server_id] = group.placed.get(server_id, 0) + 1
        flight.group = group
        if key == self._load.newest_group:
            self.estimates.group_size = sum(group.placed.values())
        self._trajectories.pop(request_id, None)
        self._trajectories[request_id] = _Trajectory(key, prompt_length, group)
        while len(self._trajectories) > TRAJECTORY_MEMORY:
            self._trajectories.popitem(last=False)

    def _hand_off_store(self, key: bytes, group: _Group, server_id: str) -> None:
        """A visit's first request on ``server_id``: copy its prompt's stored responses there from the
        replicas that hold them (those still serving): its last visit's, and, for a chunk or a refill joining
        a visit in flight, the replicas where this visit's requests have finished; count what arrived."""
        finished_here = [s for s, n in group.placed.items() if n > group.on_server.get(s, 0)]  # stored on finishing
        holders = [s for s, n in group.earlier.items() if n] + [s for s in finished_here if s not in group.earlier]
        sources = [s for s in holders if s != server_id and s in self._servers]
        if not self._stores_move or not sources:
            return
        c = self.counters
        started = time.monotonic()
        arrived = self._handoff(key, [self._servers[s] for s in sources], self._servers[server_id])
        c.store_handoff_seconds += time.monotonic() - started
        if arrived:
            c.store_handoffs += 1
            group.copied[server_id] = sum(group.earlier.get(s, 0) for s in sources)
        else:
            c.store_handoff_failures += 1

    def _advance_clock(self) -> float:
        """Add the load since the last routing event to the load integrals; returns now."""
        now = self._clock()
        last, self._load.clock_at = self._load.clock_at, now
        replicas = list(self._inflight_requests)
        if last is None or not replicas or now <= last:
            return now
        dt = now - last
        c = self.counters
        requests = [self._inflight_requests[s] for s in replicas]
        work = [self._load.work.get(s, 0.0) for s in replicas]
        c.load_max_integral += dt * max(requests)
        c.load_mean_integral += dt * sum(requests) / len(replicas)
        c.work_max_integral += dt * max(work)
        c.work_mean_integral += dt * sum(work) / len(replicas)
        return now

    def _remember(self, key: bytes, placed: dict[str, int], request_cost: float) -> None:
        """A visit ended: its replicas hold the prompt's newest responses; earlier ones keep older ones."""
        old = self._served.pop(key, None)
        self._served[key] = _Memory(placed=dict.fromkeys(old.placed if old else {}, 0) | placed,
                                    request_cost=request_cost)  # fmt: skip
        while len(self._served) > self.settings.prompt_memory:
            self._served.popitem(last=False)
