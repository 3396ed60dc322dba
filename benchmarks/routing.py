"""Where verl's requests land: the real balancers (verl 0.9.1's default, and ours in both policies) fed
DAPO rollout batches the way verl's agent loop sends them, over several epochs; counts, not times.

    .venv-verl/bin/python -m benchmarks.routing [--out benchmarks/results/routing_<date>.json]

Each batch: every prompt's n samples acquire a replica in turn (siblings adjacent, as verl repeats the
batch), then all release in a random order (a sync DAPO step). Reported per setup and balancer:
- group co-location: for each request, the share of its group's earlier requests in this batch that
  sit on its replica (1.0: the whole group on one engine, where the drafter can use every sibling);
- revisit store share: for each request of a prompt seen in an earlier epoch, the share of that
  prompt's last visit that ran on its replica, whose prompt store holds those responses (1.0: the
  group came back whole to where its store is; about 1/R when groups are spread);
- in-flight max/mean: the replicas' peak requests in flight in a batch, max over mean; worst and mean
  over the batches.
Needs verl (its balancer); runs in about a minute.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


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
    Setup("cpu_2replicas", prompts=8, batch_prompts=4, n=4, replicas=2, epochs=6),
    # Qwen3-32B: 4 replicas (2 nodes x 16 / TP 8), 96 prompts in flight (32 x 3 generation batches), n=16
    Setup("qwen3_32b", prompts=960, batch_prompts=96, n=16, replicas=4, epochs=3),
    # Qwen3-235B-A22B: 32 replicas (8 nodes x 16 / TP 4), 128 prompts a batch, n=16
    Setup("qwen3_235b", prompts=1280, batch_prompts=128, n=16, replicas=32, epochs=3),
)
BALANCERS = ("verl_default", "least_loaded", "prompt_affinity")


def make_balancer(kind: str, servers: dict):
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from rollout.verl.router import SamLoadBalancer

    if kind == "verl_default":
        return GlobalRequestLoadBalancer(dict(servers))
    return SamLoadBalancer(dict(servers), {"policy": kind})


def run_setup(setup: Setup, kind: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 150_000, size=int(rng.integers(64, 512))).tolist() for _ in range(setup.prompts)]
    servers = {f"10.0.0.{i}:8000": i for i in range(setup.replicas)}
    lb = make_balancer(kind, servers)
    sends_prompt = "prompt_ids" in lb.require_acquire_fields()
    order_rng = random.Random(seed)
    random.seed(seed)  # verl's default breaks ties with the module's random
    last_visit: dict[int, list[str]] = {}
    colocation, store_share, ratios = [], [], []
    for epoch in range(setup.epochs):
        order = list(range(setup.prompts))
        order_rng.shuffle(order)
        for start in range(0, setup.prompts, setup.batch_prompts):
            held, peak, inflight = [], dict.fromkeys(servers, 0), dict.fromkeys(servers, 0)
            placed_now: dict[int, list[str]] = {}
            for p in order[start : start + setup.batch_prompts]:
                for j in range(setup.n):
                    rid = f"{epoch}-{p}-{j}"
                    extra = {"prompt_ids": prompts[p]} if sends_prompt else {}
                    sid, _ = lb.acquire_server(request_id=rid, **extra)
                    earlier = placed_now.setdefault(p, [])
                    if earlier:
                        colocation.append(earlier.count(sid) / len(earlier))
                    earlier.append(sid)
                    if p in last_visit:
                        store_share.append(last_visit[p].count(sid) / len(last_visit[p]))
                    inflight[sid] += 1
                    peak[sid] = max(peak[sid], inflight[sid])
                    held.append((sid, rid))
            last_visit.update(placed_now)
            order_rng.shuffle(held)
            for sid, rid in held:
                lb.release_server(sid, request_id=rid)
            ratios.append(max(peak.values()) / (sum(peak.values()) / len(peak)))
    return {
        "group_colocation": float(np.mean(colocation)),
        "revisit_store_share": float(np.mean(store_share)) if store_share else None,
        "inflight_max_over_mean_worst": float(max(ratios)),
        "inflight_max_over_mean_mean": float(np.mean(ratios)),
        "batches": len(ratios),
        "requests": setup.prompts * setup.n * setup.epochs,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the table as JSON here")
    p.add_argument("--seeds", type=int, default=3, help="runs per setup and balancer (data and tie-breaking)")
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
    print("setup          balancer         co-location  revisit store share  in-flight max/mean worst (mean)")
    for setup in SETUPS:
        for kind in BALANCERS:
            runs = [run_setup(setup, kind, seed) for seed in range(args.seeds)]
            row = {"setup": asdict(setup), "balancer": kind, "runs": runs}
            rows.append(row)
            co = [r["group_colocation"] for r in runs]
            rv = [r["revisit_store_share"] for r in runs]
            worst = [r["inflight_max_over_mean_worst"] for r in runs]
            mean = [r["inflight_max_over_mean_mean"] for r in runs]
            print(
                f"{setup.name:<14} {kind:<16} {min(co):.3f}-{max(co):.3f}  {min(rv):.3f}-{max(rv):.3f}"
                f"          {max(worst):.3f} ({np.mean(mean):.3f})"
            )
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.out:
        args.out.write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
