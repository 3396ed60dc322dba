"""Replay benchmark: acceptance on real traces and drafting cost, every method in one run.

    python -m benchmarks.bench_replay [--groups N] [--out results/] [--traces qwen25math|FILE.npz]

Prints tables, writes replay.json and acceptance_by_position.png under --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from sam import DraftConfig

from . import continuation_study, speed
from .drafters import ArcticSuffixDrafter, SamDrafter, VllmNgramDrafter, arctic_available, vllm_available
from .replay import bin_labels, replay
from .traces import QWEN25MATH, load_trace_set

HISTORY_TOKENS = 1 << 21  # 2M tokens: more than the traces hold, so nothing is evicted here
MIN_PLOTTED_STEPS = 1000  # position bins with fewer decode steps are too noisy to plot


def sam_methods() -> list[SamDrafter]:
    own = dict(group_aware=False)
    group = dict(group_aware=True)
    history = dict(group_aware=True, history_tokens=HISTORY_TOKENS)
    return [
        SamDrafter("SAM own context", DraftConfig(**own)),
        SamDrafter("SAM group-aware", DraftConfig(**group)),
        SamDrafter("SAM own + history", DraftConfig(group_aware=False, history_tokens=HISTORY_TOKENS)),
        SamDrafter("SAM group + history", DraftConfig(**history)),
        SamDrafter("SAM group + history, 64k-token history", DraftConfig(group_aware=True, history_tokens=1 << 16)),
        SamDrafter("SAM group + history, min match 2", DraftConfig(**history, min_match=2)),
        SamDrafter("SAM group + history, min match 3", DraftConfig(**history, min_match=3)),
        SamDrafter("SAM group + history, scaled length", DraftConfig(**history, length_policy="scaled")),
        SamDrafter("SAM group + history, min 2, scaled", DraftConfig(**history, min_match=2, length_policy="scaled")),
    ]


def peer_methods(notes: list[str]) -> list:
    peers = []
    if vllm_available():
        peers += [VllmNgramDrafter(5, 5), VllmNgramDrafter(1, 4)]
    else:
        notes.append("vLLM n-gram SKIPPED: vllm is not importable")
    if arctic_available():
        peers.append(ArcticSuffixDrafter())
    else:
        notes.append(
            "Arctic suffix decoding SKIPPED: arctic_inference is not importable "
            "(scripts/install_arctic_suffix.sh builds it)"
        )
    return peers


def run_acceptance(groups, k: int, notes: list[str]) -> dict:
    results = {}
    for method in sam_methods() + peer_methods(notes):
        t0 = time.perf_counter()
        stats = replay(method, groups, k)
        results[method.name] = stats.as_dict() | {"replay_seconds": time.perf_counter() - t0}
        print(f"  {method.name:<42} {stats.acceptance_length:.3f}", flush=True)
    return results


def run_speed(groups, notes: list[str]) -> dict:
    corpus = np.concatenate([r for g in groups for r in g.responses])
    out: dict = {"contexts": {}, "build": {}}
    for context in (1024, 8192, 32768):
        row = {
            "sam_batch64_us": speed.sam_step_us(corpus, context, batch=64),
            "sam_batch8_us": speed.sam_step_us(corpus, context, batch=8),
            "sam_single_us": speed.sam_step_us(corpus, context, batch=1),
        }
        if vllm_available():
            row["vllm_ngram_5_5_us"] = speed.vllm_ngram_step_us(corpus, context)
            row["vllm_ngram_1_4_us"] = speed.vllm_ngram_step_us(corpus, context, 1, 4)
        if arctic_available():
            row["arctic_us"] = speed.arctic_step_us(corpus, context)
        out["contexts"][str(context)] = row
        print(f"  context {context}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    us, bytes_per_token = speed.sam_build(corpus, 32768)
    out["build"] = {"tokens": 32768, "us_per_token": us, "bytes_per_token": bytes_per_token}
    return out


def print_tables(acceptance: dict, speed_results: dict) -> None:
    labels = bin_labels()
    print("\nAcceptance length (tokens per decode step, bonus included), k=3, honest lockstep")
    print(f"{'method':<44}{'mean':>7}{'eff':>7}" + "".join(f"{b:>10}" for b in labels))
    for name, r in acceptance.items():
        cells = "".join(f"{v:>10.2f}" if v is not None else f"{'-':>10}" for v in r["by_position"].values())
        print(f"{name:<44}{r['acceptance_length']:>7.3f}{r['draft_efficiency']:>7.2f}{cells}")
    steps = next(iter(acceptance.values()))["steps_by_position"].values()
    print(f"{'(decode steps in the bin)':<58}" + "".join(f"{n:>10}" for n in steps))
    print("\nDrafting cost per request-step (append 1-4 tokens, propose 3), median microseconds")
    rows = speed_results["contexts"]
    keys = list(next(iter(rows.values())).keys())
    print(f"{'context':<9}" + "".join(f"{k:>20}" for k in keys))
    for ctx, row in rows.items():
        print(f"{ctx:<9}" + "".join(f"{row[k]:>20.2f}" for k in keys))
    b = speed_results["build"]
    print(
        f"\nBuild from scratch: {b['us_per_token']:.3f} us/token; memory {b['bytes_per_token']:.1f} bytes/token "
        f"({b['tokens']} tokens)"
    )


def target_checks(acceptance: dict, speed_results: dict) -> dict:
    """The issue's targets, each as measured here (True = met)."""
    acc = {name: r["acceptance_length"] for name, r in acceptance.items()}
    rows = speed_results["contexts"]
    checks = {
        "step <= 1 us at 32k (batch 64)": rows["32768"]["sam_batch64_us"] <= 1.0,
        "32k step <= 1.5x 1k step (batch 64)": rows["32768"]["sam_batch64_us"] <= 1.5 * rows["1024"]["sam_batch64_us"],
        "build <= 0.2 us/token": speed_results["build"]["us_per_token"] <= 0.2,
        "<= 64 bytes/token": speed_results["build"]["bytes_per_token"] <= 64,
        "group >= own + 0.25": acc["SAM group-aware"] >= acc["SAM own context"] + 0.25,
    }
    if "vllm_ngram_5_5_us" in rows["8192"]:
        checks[">= 20x faster than vLLM n-gram at 8k"] = (
            rows["8192"]["vllm_ngram_5_5_us"] >= 20 * rows["8192"]["sam_batch64_us"]
        )
        checks["own >= vLLM n-gram (5,5)"] = acc["SAM own context"] >= acc["vLLM n-gram (5,5)"]
    if "Arctic suffix decoding" in acc:
        checks["group + history > Arctic"] = acc["SAM group + history"] > acc["Arctic suffix decoding"]
    return checks


def plot(acceptance: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(acceptance.values()))
    keep = [b for b, n in first["steps_by_position"].items() if n >= MIN_PLOTTED_STEPS]
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, r in acceptance.items():
        if "min" in name or "scaled" in name or "64k" in name:
            continue  # the policy variants crowd the plot; they are in the table and the JSON
        values = [np.nan if r["by_position"][b] is None else r["by_position"][b] for b in keep]
        ax.plot(keep, values, marker="o", label=f"{name} ({r['acceptance_length']:.2f})")
    ax.set_xlabel(f"position in response (tokens; bins with >= {MIN_PLOTTED_STEPS} decode steps)")
    ax.set_ylabel("mean acceptance length (k=3, bonus included)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=None, help="replay only the first N groups")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--traces", default=QWEN25MATH, help=f"'{QWEN25MATH}' (shared traces) or a trace file (.npz)")
    args = parser.parse_args(argv)
    notes: list[str] = []
    print(f"Loading traces {args.traces} ...", flush=True)
    trace_set, groups = load_trace_set(args.traces, args.groups)
    print(f"{len(groups)} groups, {sum(len(r) for g in groups for r in g.responses)} response tokens")
    print("Replaying (mean acceptance length):", flush=True)
    acceptance = run_acceptance(groups, args.k, notes)
    print("Continuation policies (plain-Python reference; the compiled drafter follows 'first'):", flush=True)
    continuations = continuation_study.run(groups, args.k)
    speed_results = {"contexts": {}, "build": {}}
    if not args.skip_speed:
        print("Timing:", flush=True)
        speed_results = run_speed(groups, notes)
        print_tables(acceptance, speed_results)
    checks = target_checks(acceptance, speed_results) if not args.skip_speed else {}
    for name, met in checks.items():
        print(f"  target {'MET   ' if met else 'MISSED'} {name}")
    for note in notes:
        print("NOTE:", note)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(),
        "k": args.k,
        "trace_set": trace_set,
        "groups": len(groups),
        "acceptance": acceptance,
        "continuation_policies": continuations,
        "speed": speed_results,
        "targets": checks,
        "notes": notes,
    }
    (args.out / "replay.json").write_text(json.dumps(report, indent=2))
    title = f"Replay of {trace_set} ({len(groups)} prompts), honest lockstep"
    plot(acceptance, args.out / "acceptance_by_position.png", title)
    print(f"wrote {args.out / 'replay.json'} and {args.out / 'acceptance_by_position.png'}")
    return report


if __name__ == "__main__":
    main()
