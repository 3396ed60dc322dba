"""Where verl's requests land: the real balancers (verl 0.9.1's default, and ours in both policies, with
prompt affinity without store handoffs, with them placing groups whole, and with them in chunks, the
default) fed DAPO rollout batches over several epochs, on a simulated clock; counts and simulated
seconds, not wall time.

    .venv-verl/bin/python -m benchmarks.routing [--out benchmarks/results/routing_<date>.json]

Each request's length (its seconds in flight) is drawn per prompt and per sample: log-normal, with the
prompt's share of the log-variance 0.79 (the log-length ICC of the Qwen traces), so one prompt's samples
are long or short together. A batch's requests acquire a replica one after another (siblings adjacent,
as verl repeats the batch) and each releases when its length has passed. Patterns:
- steady: equal batches, the next once the last has finished (a sync DAPO step);
- shrink_grow: batch sizes 1, 1/2, 1/4, 1/2, 1, ... of the setup's, sync;
- overlap: equal batches, the next arriving once half the last's requests have finished (async);
- mixed_groups: steady, with each prompt's group 1/4, 1/2 or all of n samples.
Reported per setup, pattern and balancer:
- group co-location: for each request, the share of its group's earlier requests in this batch that sit
  on its replica (1.0: the whole group on one engine, where the drafter can use every sibling);
- revisit store share: for each request of a prompt whose earlier visit has ended, the share of its last visit
  that ran on its replica, whose prompt store holds those responses (1.0: the group came back whole);
  store available: the same, counting the responses a store handoff copied to its replica; handoffs:
  the groups whose store was copied, per revisiting group;
- in-flight max/mean: the integral over time of the most loaded replica's in-flight requests over that
  of the mean over replicas (simultaneous load; 1.0: the replicas always equally loaded), and the same
  in work (each in-flight request weighing its length);
- work max/mean per batch: the replicas' summed request lengths in a batch, max over mean; worst and
  mean over batches.
Also a clairvoyant reference per setup: steady batches placed by true lengths, chunks longest first
(``clairvoyant_inflight``), for the in-flight a placement of whole groups or chunks can reach.
Needs verl (its balancer); runs in a few minutes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np

from testkit.store_copies import StoreCopies


@dataclass(frozen=True)
class Setup:
    name: str
    prompts: int  # the training set (a revisit regime when small)
    batch_prompts: int  # prompts per rollout batch
    n: int  # samples per prompt (GRPO group)
    replicas: int
    epochs: int


SETUPS = (
    # the CPU preset with 2 replicas, 8 prompts (the two-replica A/B's revisit regime)
    Setup("cpu_2replicas", prompts=8, batch_prompts=4, n=4, replicas=2, epochs=8),
    # Qwen3-32B: 4 replicas (2 nodes x 16 / TP 8), 96 prompts in flight (32 x 3 generation batches), n=16
    Setup("qwen3_32b", prompts=960, batch_prompts=96, n=16, replicas=4, epochs=3),
    # Qwen3-235B-A22B: 32 replicas (8 nodes x 16 / TP 4), 128 prompts a batch, n=16
    Setup("qwen3_235b", prompts=1280, batch_prompts=128, n=16, replicas=32, epochs=3),
)
PATTERNS = ("steady", "shrink_grow", "overlap", "mixed_groups")
BALANCERS = ("verl_default", "least_loaded", "fixed_stores", "whole_groups", "prompt_affinity")
LOG_LENGTH_SD = 0.8  # of a request's log length
LENGTH_ICC = 0.79  # the prompt's share of the log-length variance
SHRINK_GROW = (1, 2, 4, 2)  # batch size divisors, in turn
ARRIVAL_GAP_S = 1e-4  # between a batch's acquires (verl sends a batch at once)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# router settings every prompt_affinity balancer made here takes on top of the defaults (``affinity_settings``)
_AFFINITY_SETTINGS: dict = {}


@contextmanager
def affinity_settings(**settings):
    """Within the block, the prompt_affinity balancers (here and in the cluster simulator) take these
    router settings (e.g. ``group_chunk=8``), to compare settings through the same benchmarks."""
    saved = dict(_AFFINITY_SETTINGS)
    _AFFINITY_SETTINGS.update(settings)
    try:
        yield
    finally:
        _AFFINITY_SETTINGS.clear()
        _AFFINITY_SETTINGS.update(saved)


def make_balancer(kind: str, servers: dict, clock: Clock):
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from sam_rollout.verl.runtime.router import SamLoadBalancer

    if kind == "verl_default":
        return GlobalRequestLoadBalancer(dict(servers))
    if kind == "fixed_stores":  # the rule of f7abba7: stores stay, their replicas judged in requests
        config = {"policy": "prompt_affinity", "store_handoff": False, "group_chunk": 0}
        lb = SamLoadBalancer(dict(servers), config, clock=clock)
    elif kind == "whole_groups":  # store handoffs, groups placed whole (the rule before group_chunk)
        config = {"policy": "prompt_affinity", "group_chunk": 0}
        lb = SamLoadBalancer(dict(servers), config, clock=clock, handoff=StoreCopies())
    else:
        config = {"policy": kind} | (_AFFINITY_SETTINGS if kind == "prompt_affinity" else {})
        lb = SamLoadBalancer(dict(servers), config, clock=clock, handoff=StoreCopies())
    lb.set_ring_names({sid: f"rollout_{i}" for i, sid in enumerate(servers)})
    return lb


def store_copies(lb) -> list:
    """The copies the balancer's handoff made so far (none without handoffs)."""
    handoff = getattr(lb, "_handoff", None)
    return handoff.copies if isinstance(handoff, StoreCopies) else []


def prompt_key_of(ids) -> bytes:
    from sam_rollout.drafter.prompt_store import prompt_key

    return prompt_key(np.asarray(ids, dtype=np.int32))


# the cluster simulator's routings that run a real balancer here: {its name: make_balancer's kind}
SIMULATOR_ROUTINGS = {"handoff": "prompt_affinity", "fixed_stores": "fixed_stores"}


def place_batches(kind: str, replicas: int, batches, seed: int = 0) -> list[dict]:
    """Drive balancer ``kind`` through synchronous rollout steps (a step's requests all acquire, then each
    releases when its seconds have passed; the next step starts once all have). ``batches``: per step, its
    groups in arrival order, each (prompt id, seconds per request). Returns per step ``where`` (per group,
    the replica index of each request), ``store_share`` (over requests of prompts seen before, the
    share of the prompt's last visit on the request's replica; None when none returns), ``store_available``
    (the same, counting a store handoff's copy) and ``moved`` (prompt ids whose store was copied to
    their replica)."""
    servers = {f"10.0.0.{i}:8000": i for i in range(replicas)}
    clock = Clock()
    lb = make_balancer(kind, servers, clock)
    end_step = getattr(lb, "end_step", None)  # ours: the trainer's metrics hook calls it after each step
    rng = np.random.default_rng(seed)
    random.seed(seed)  # verl's default breaks ties with the module's random
    tokens: dict = {}  # prompt id -> its token ids (the balancer keys on them)
    last_visit: dict = {}  # prompt id -> replica index per request of its last visit
    out = []
    for step in batches:
        where, shares, available, moved, events = [], [], [], [], []
        for prompt, seconds in step:
            ids = tokens.setdefault(prompt, rng.integers(0, 150_000, size=int(rng.integers(64, 512))).tolist())
            copied_before = len(store_copies(lb))
            placed = []
            for j, s in enumerate(seconds):
                clock.now += ARRIVAL_GAP_S
                rid = f"{len(out)}-{prompt}-{j}"
                sid, _ = lb.acquire_server(request_id=rid, prompt_ids=ids)
                placed.append(servers[sid])
                events.append((clock.now + float(s), rid, sid))
            key = prompt_key_of(ids)
            copy = [t for k, _, t in store_copies(lb)[copied_before:] if k == key]
            if prompt in last_visit:
                before = last_visit[prompt]
                shares += [before.count(r) / len(before) for r in placed]
                available += [1.0 if r in copy else before.count(r) / len(before) for r in placed]
            if copy:
                moved.append(prompt)
            where.append(np.array(placed, dtype=np.int64))
        for t, rid, sid in sorted(events):
            clock.now = t
            lb.release_server(sid, request_id=rid)
        if end_step is not None:
            end_step()
        last_visit.update({prompt: w.tolist() for (prompt, _), w in zip(step, where)})
        out.append({
            "where": where,
            "store_share": float(np.mean(shares)) if shares else None,
            "store_available": float(np.mean(available)) if available else None,
            "moved": moved,
        })  # fmt: skip
    return out


class LoadIntegral:
    """∫ max_r L_r dt and ∫ mean_r L_r dt of in-flight requests and of in-flight work (lengths)."""

    def __init__(self, servers) -> None:
        self.requests = dict.fromkeys(servers, 0)
        self.work = dict.fromkeys(servers, 0.0)
        self.at = 0.0
        self.sums = np.zeros(4)

    def advance(self, now: float) -> None:
        dt = now - self.at
        if dt > 0:
            r, w = list(self.requests.values()), list(self.work.values())
            self.sums += dt * np.array([max(r), np.mean(r), max(w), np.mean(w)])
        self.at = now

    def ratios(self) -> tuple[float, float]:
        s = self.sums
        return float(s[0] / s[1]) if s[1] else 1.0, float(s[2] / s[3]) if s[3] else 1.0


def run_setup(setup: Setup, kind: str, pattern: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 150_000, size=int(rng.integers(64, 512))).tolist() for _ in range(setup.prompts)]
    prompt_log_mean = rng.normal(0.0, LOG_LENGTH_SD * math.sqrt(LENGTH_ICC), setup.prompts)
    sample_sd = LOG_LENGTH_SD * math.sqrt(1 - LENGTH_ICC)
    sizes = [setup.n] * setup.prompts
    if pattern == "mixed_groups":
        sizes = [max(1, setup.n // int(rng.choice([1, 2, 4]))) for _ in range(setup.prompts)]
    servers = {f"10.0.0.{i}:8000": i for i in range(setup.replicas)}
    clock = Clock()
    lb = make_balancer(kind, servers, clock)
    sends_prompt = "prompt_ids" in lb.require_acquire_fields()
    order_rng = random.Random(seed)
    random.seed(seed)  # verl's default breaks ties with the module's random
    batches = []  # each batch's prompts
    for _epoch in range(setup.epochs):
        order = list(range(setup.prompts))
        order_rng.shuffle(order)
        start, turn = 0, 0
        while start < setup.prompts:
            size = setup.batch_prompts // (SHRINK_GROW[turn % len(SHRINK_GROW)] if pattern == "shrink_grow" else 1)
            batches.append(order[start : start + max(size, 1)])
            start += max(size, 1)
            turn += 1
    load = LoadIntegral(servers)
    last_visit: dict[int, list[str]] = {}
    colocation, store_share, store_available, work_ratios = [], [], [], []
    revisiting_groups = 0
    keys = [prompt_key_of(ids) for ids in prompts]
    events: list = []  # (time, seq, request id, server, length)
    inflight_of: dict[int, int] = {}  # prompt -> its requests in flight
    seq = 0
    now = 0.0
    end_step = getattr(lb, "end_step", None)  # ours: the trainer's metrics hook calls it after each step
    for b, batch in enumerate(batches):
        if b and end_step is not None:
            end_step()
        releases_wanted = 0  # of the last batch's requests
        if b and pattern == "overlap":  # arrive once half of the last batch has finished
            releases_wanted = sum(sizes[p] for p in batches[b - 1]) // 2
        while events and (pattern != "overlap" or releases_wanted > 0):
            t, _, rid, sid, length = heapq.heappop(events)
            now = clock.now = t
            load.advance(t)
            lb.release_server(sid, request_id=rid)
            load.requests[sid] -= 1
            load.work[sid] -= length
            inflight_of[int(rid.split("-")[1])] -= 1
            releases_wanted -= rid.startswith(f"{b - 1}-")
        placed_now: dict[int, list[str]] = {}
        work_here = dict.fromkeys(servers, 0.0)
        for p in batch:
            copied_before = len(store_copies(lb))
            # a revisit, as the router counts one: the prompt's earlier visit has ended (in the overlap
            # pattern a long visit may still run when its prompt comes round again; its requests join it)
            revisit = p in last_visit and not inflight_of.get(p)
            revisiting_groups += revisit
            for j in range(sizes[p]):
                now += ARRIVAL_GAP_S
                clock.now = now
                load.advance(now)
                rid = f"{b}-{p}-{j}"
                extra = {"prompt_ids": prompts[p]} if sends_prompt else {}
                sid, _ = lb.acquire_server(request_id=rid, **extra)
                earlier = placed_now.setdefault(p, [])
                if earlier:
                    colocation.append(earlier.count(sid) / len(earlier))
                earlier.append(sid)
                if revisit:
                    share = last_visit[p].count(sid) / len(last_visit[p])
                    copied = any(k == keys[p] and t == servers[sid] for k, _, t in store_copies(lb)[copied_before:])
                    store_share.append(share)
                    store_available.append(1.0 if copied else share)
                length = float(np.exp(prompt_log_mean[p] + rng.normal(0.0, sample_sd)))
                load.requests[sid] += 1
                load.work[sid] += length
                work_here[sid] += length
                heapq.heappush(events, (now + length, seq, rid, sid, length))
                inflight_of[p] = inflight_of.get(p, 0) + 1
                seq += 1
        last_visit.update(placed_now)
        work_ratios.append(max(work_here.values()) / np.mean(list(work_here.values())))
    while events:
        t, _, rid, sid, length = heapq.heappop(events)
        clock.now = t
        load.advance(t)
        lb.release_server(sid, request_id=rid)
        load.requests[sid] -= 1
        load.work[sid] -= length
    inflight, work = load.ratios()
    return {
        "group_colocation": float(np.mean(colocation)),
        "revisit_store_share": float(np.mean(store_share)) if store_share else None,
        "revisit_store_available": float(np.mean(store_available)) if store_available else None,
        "handoffs_per_revisiting_group": len(store_copies(lb)) / revisiting_groups if revisiting_groups else None,
        "inflight_max_over_mean": inflight,
        "inflight_work_max_over_mean": work,
        "batch_work_max_over_mean_worst": float(max(work_ratios)),
        "batch_work_max_over_mean_mean": float(np.mean(work_ratios)),
        "batches": len(batches),
        "requests": seq,
    }


def clairvoyant_inflight(setup: Setup, chunk: int, seed: int = 0) -> float:
    """A reference no router that sees only the past can reach: steady batches, each group cut into chunks
    of ``chunk`` requests, the chunks placed longest first (by their true summed lengths) on the replica
    with the least work; in-flight max/mean over the run (∫max / ∫mean of requests, the drain included)."""
    rng = np.random.default_rng(seed)
    prompt_log_mean = rng.normal(0.0, LOG_LENGTH_SD * math.sqrt(LENGTH_ICC), setup.prompts)
    sample_sd = LOG_LENGTH_SD * math.sqrt(1 - LENGTH_ICC)
    sums = np.zeros(2)
    for _epoch in range(setup.epochs):
        order = rng.permutation(setup.prompts)
        for start in range(0, setup.prompts, setup.batch_prompts):
            batch = order[start : start + setup.batch_prompts]
            lengths = np.exp(prompt_log_mean[batch][:, None] + rng.normal(0.0, sample_sd, (len(batch), setup.n)))
            chunks = [g[i : i + chunk] for g in lengths for i in range(0, setup.n, chunk)]
            work = np.zeros(setup.replicas)
            ends = []  # (end time, replica)
            for c in sorted(chunks, key=lambda c: -c.sum()):
                r = int(np.argmin(work))
                work[r] += c.sum()
                ends += [(float(t), r) for t in c]
            load = np.bincount([r for _, r in ends], minlength=setup.replicas).astype(float)
            at = 0.0
            for t, r in sorted(ends):
                sums += (t - at) * np.array([load.max(), load.mean()])
                load[r] -= 1
                at = t
    return float(sums[0] / sums[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the table as JSON here")
    p.add_argument("--seeds", type=int, default=3, help="runs per setup, pattern and balancer (data and tie-breaking)")
    p.add_argument("--setups", nargs="*", default=[s.name for s in SETUPS], help="which setups")
    p.add_argument("--patterns", nargs="*", default=list(PATTERNS), help="which patterns")
    args = p.parse_args(argv)
    try:
        import verl  # noqa: F401
    except ImportError:
        print(
            "error: needs verl 0.9.1 (bash scripts/setup_verl_env.sh; run with .venv-verl/bin/python)", file=sys.stderr
        )
        return 2
    t0 = time.perf_counter()
    rows = []
    print("setup          pattern       balancer         co-location  store share  available    handoffs     "
          "in-flight m/m  work m/m     batch work m/m worst (mean)")  # fmt: skip
    for setup in (s for s in SETUPS if s.name in args.setups):
        for pattern in args.patterns:
            for kind in BALANCERS:
                runs = [run_setup(setup, kind, pattern, seed) for seed in range(args.seeds)]
                rows.append({"setup": asdict(setup), "pattern": pattern, "balancer": kind, "runs": runs})

                def span(name, runs=runs):
                    v = [r[name] for r in runs if r[name] is not None]
                    return f"{min(v):.3f}-{max(v):.3f}" if v else "-"

                print(
                    f"{setup.name:<14} {pattern:<13} {kind:<16} {span('group_colocation')}  "
                    f"{span('revisit_store_share')}  {span('revisit_store_available')}  "
                    f"{span('handoffs_per_revisiting_group')}  {span('inflight_max_over_mean')}  "
                    f"{span('inflight_work_max_over_mean')}  "
                    f"{max(r['batch_work_max_over_mean_worst'] for r in runs):.3f} "
                    f"({np.mean([r['batch_work_max_over_mean_mean'] for r in runs]):.3f})",
                    flush=True,
                )
    reference = {}
    for setup in (s for s in SETUPS if s.name in args.setups):
        chunks = sorted({setup.n, min(4, setup.n), 1}, reverse=True)
        seeds = range(args.seeds)
        reference[setup.name] = {c: [clairvoyant_inflight(setup, c, seed) for seed in seeds] for c in chunks}
        print(
            f"{setup.name}: clairvoyant reference, steady, chunks placed longest first by true length, in-flight "
            + ", ".join(f"chunk {c} {min(v):.3f}-{max(v):.3f}" for c, v in reference[setup.name].items())
        )
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.out:
        record = {"seeds": args.seeds, "rows": rows, "clairvoyant_inflight_steady": reference}
        with open(args.out, "w") as f:
            f.write(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
