"""The router's ``group_chunk`` chosen on the cluster simulator: rollout time at the recipes' scale with our
balancer (store handoffs) placing groups whole (0) or in chunks of 8, 4, 2, 1 requests, against verl's
routing, with response lengths independent and correlated within a prompt (the traces' ICC).

    .venv-verl/bin/python -m benchmarks.group_chunk [--chunks 0 1 2 4 8] [--seeds 4]

For each chunk size: the routed replay of the Qwen2.5-Math traces through the real balancer at the
recipes' replica counts (first epoch and revisits: acceptance with the siblings and stores each request
finds on its replica), then ``benchmarks.simulator`` at 32B (4 replicas) and 235B (32), the real balancer
placing each step. The other routings' profiles come from the stored routed replay
(``simulate_cluster_acceptance_qwen25math_k3.json``). Prints and writes each case's time over verl's
routing with no speculation (``x_default_off``), for verl's routing and ours. About 6 minutes a chunk
size on 2 cores; needs verl (its balancer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import simulate_rollout as sr
from benchmarks import simulator as sim
from benchmarks.routing import affinity_settings
from benchmarks.traces import load_trace_set

ROUTED_REPLAY = sr.ROOT / "benchmarks/results/simulate_cluster_acceptance_qwen25math_k3.json"
ROUTING = "handoff"  # the balancer's routing in the simulator: prompt_affinity, store handoffs
CASES = (("default", "first"), ("default", "later"), (ROUTING, "first"), (ROUTING, "later"))


def run_chunk(chunk: int, groups, stored: dict, scale_list, seeds: int, args) -> dict:
    """Rollout time ratios per scale and length correlation with our balancer at ``chunk``."""
    with affinity_settings(group_chunk=chunk):
        replicas = sorted({sc.setup.replicas for sc in scale_list})
        profiles = dict(stored["profiles"])
        profiles.update(sim.routed_profiles(groups, replicas, args.cluster_k, routings=(ROUTING,)))
        sam = sim.Policy("auto", np.zeros(1, dtype=np.int64), sim.ONLINE, args.cluster_overhead_ms)
        out = {"tokens_per_step": {k: v["mean_tokens_per_step"] for k, v in profiles.items() if k.startswith(ROUTING)}}
        lengths = sr.grouped_lengths(scale_list)
        for sc in scale_list:
            setup = sc.setup
            grid = sim.CostGrid.build(sc.cost, setup.max_num_seqs, args.cluster_k, setup.max_response + 2048)
            tables, acceptance = sim.routed_tables(profiles, setup.replicas, args.cluster_k, args.min_steps)
            for corr in (0.0, stored["log_length_icc"]):
                draws = sim.length_draws(lengths, setup, seeds, corr)
                rows = sim.scale_rows(sc, setup.replicas, tables, draws, sam, grid, acceptance)
                x = {(r["routing"], r["arm"]): r["x_default_off"] for r in rows}
                case = f"{setup.name}, length ICC {corr:.2f}"
                out[case] = {f"{ro} {arm}": x[(ro, arm)] for ro, arm in CASES}
                print(
                    f"chunk {chunk}: {case}: "
                    + ", ".join(f"{ro} {arm} {x[(ro, arm)]:.3f}x" for ro, arm in CASES)
                    + f" (no speculation, ours placed: first {x[(ROUTING, 'off first')]:.3f}x,"
                    f" later {x[(ROUTING, 'off later')]:.3f}x)",
                    flush=True,
                )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 1, 2, 4, 8], help="group_chunk values (0: whole)")
    p.add_argument("--seeds", type=int, default=4, help="length draws per case (the cluster simulator's default)")
    p.add_argument("--out", help="write the results as JSON here")
    args, rest = p.parse_known_args(argv)
    sim_args = sr.parse_args(["--cluster", *rest])
    try:
        import verl  # noqa: F401
    except ImportError:
        print("error: needs verl 0.9.1 (bash scripts/setup_verl_env.sh; run with .venv-verl/bin/python)",
              file=sys.stderr)  # fmt: skip
        return 2
    t0 = time.time()
    stored = json.loads(ROUTED_REPLAY.read_text())
    _, groups = load_trace_set(sim_args.cluster_traces)
    scale_list = sr.cluster_scales(sim_args)
    results = {str(c): run_chunk(c, groups, stored, scale_list, args.seeds, sim_args) for c in args.chunks}
    print(f"({time.time() - t0:.0f} s)")
    if args.out:
        record = dict(
            date=time.strftime("%Y-%m-%d"),
            seeds=args.seeds,
            routed_replay=str(ROUTED_REPLAY.relative_to(sr.ROOT)),
            log_length_icc=stored["log_length_icc"],
            seconds=round(time.time() - t0, 1),
            results=results,
        )
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
