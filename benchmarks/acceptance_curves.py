"""Acceptance against context: mean tokens per decode step by response position, per drafter.

Library part of ``python -m benchmarks.acceptance_curves``. Each method replays a trace set in honest lockstep
(``benchmarks.replay``); the steps are binned by the response position they start at.

The JSON it writes is the rollout simulator's acceptance profile:

    {"k": 3, "trace_set": name, "bin_edges": [0, 128, ...],      # lower edges; the last bin is open-ended
     "methods": {key: {"tokens_per_step": [...],                 # per bin, bonus included; null if no steps
                       "drafted_per_step": [...],                # per bin, mean drafted tokens per step
                       "steps": [...]}}}                         # per bin, decode steps
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sam_rollout.drafter import DraftConfig
from testkit.data import TraceGroup

from .drafters import ArcticSuffixDrafter, SamDrafter, VllmNgramDrafter, arctic_available, vllm_available
from .replay import ReplayStats, replay, replay_revisits
from .traces import QWEN25MATH, load_trace_set

HISTORY_TOKENS = 1 << 21  # as in bench_replay: more than these traces hold, so nothing is evicted
SMALL_HISTORY = 1 << 16  # the revisit proxy's history: less than one epoch of either trace set
FIRST_EDGE = 128


@dataclass
class Method:
    key: str  # the JSON key the simulator reads
    label: str
    make: Callable[[], object]  # a fresh drafter (state must not leak between trace sets)
    available: Callable[[], bool] = lambda: True
    missing: str = ""


def sam_method(key: str, label: str, **settings) -> Method:
    """Our drafter with these DraftConfig settings, as a method of the profile."""
    return Method(key, label, lambda: SamDrafter(key, DraftConfig(**settings)))


FIRST = dict(continuation="first")
FREQUENT = dict(continuation="frequent")
ADAPTIVE = dict(continuation="adaptive", length_policy="fixed")  # k tokens at every match
MATCH = dict(continuation="adaptive", length_policy="match")  # base_k, match_scale: DraftConfig's defaults
GROUP_HISTORY = dict(group_aware=True, history_tokens=HISTORY_TOKENS)
METHODS = [
    sam_method("sam_own", "SAM own context, first occurrence", group_aware=False, **FIRST),
    sam_method("sam_group", "SAM group-aware, first occurrence", group_aware=True, **FIRST),
    sam_method("sam_group_history", "SAM group + history, first occurrence", **GROUP_HISTORY, **FIRST),
    sam_method("sam_group_history_frequent", "SAM group + history, frequent", **GROUP_HISTORY, **FREQUENT),
    sam_method(
        "sam_group_history_adaptive", "SAM group + history, adaptive, fixed length", **GROUP_HISTORY, **ADAPTIVE
    ),
    sam_method("sam_group_history_match", "SAM group + history, adaptive, match length", **GROUP_HISTORY, **MATCH),
    sam_method(
        "sam_group_history_confidence",
        "SAM group + history, frequent, confidence 0.1",
        **GROUP_HISTORY,
        **FREQUENT,
        length_policy="confidence",
        min_token_prob=0.1,
    ),
    Method(
        "ngram",
        "vLLM n-gram (5,5), vLLM's default",
        lambda: VllmNgramDrafter(5, 5),
        vllm_available,
        "vllm is not importable",
    ),
    Method("ngram_1_4", "vLLM n-gram (1,4)", lambda: VllmNgramDrafter(1, 4), vllm_available, "vllm is not importable"),
    Method(
        "suffix",
        "Arctic suffix decoding (vLLM defaults)",
        lambda: ArcticSuffixDrafter(),
        arctic_available,
        "arctic_inference is not importable (scripts/install_arctic_suffix.sh builds it)",
    ),
]
# The revisit proxy (`replay_revisits`): a 64k-token history, smaller than one epoch of earlier visits.
SMALL_GROUP_HISTORY = dict(group_aware=True, history_tokens=SMALL_HISTORY)
REVISIT_METHODS = [
    sam_method("sam_first_64k", "SAM group + 64k history, first occurrence", **SMALL_GROUP_HISTORY, **FIRST),
    sam_method("sam_frequent_64k", "SAM group + 64k history, frequent", **SMALL_GROUP_HISTORY, **FREQUENT),
    sam_method(
        "sam_frequent_64k_store",
        "SAM group + 64k history + prompt store, frequent",
        **SMALL_GROUP_HISTORY,
        **FREQUENT,
        prompt_store=True,
    ),
    sam_method(
        "sam_adaptive_64k_store",
        "SAM group + 64k history + prompt store, adaptive, fixed length",
        **SMALL_GROUP_HISTORY,
        **ADAPTIVE,
        prompt_store=True,
    ),
    sam_method(
        "sam_match_64k_store",
        "SAM group + 64k history + prompt store, adaptive, match length",
        **SMALL_GROUP_HISTORY,
        **MATCH,
        prompt_store=True,
    ),
    METHODS[-1],  # Arctic suffix decoding (its global cache holds the earlier epoch here)
]
METHOD_KEYS = [m.key for m in METHODS + REVISIT_METHODS[:-1]]


def power_of_two_edges(longest_response: int, first: int = FIRST_EDGE) -> list[int]:
    """0, first, 2*first, ... up to the last power-of-two edge below the longest response, so that the
    open-ended last bin still holds steps (a response of L tokens has decode steps at positions < L)."""
    edges = [0]
    edge = first
    while edge < longest_response:
        edges.append(edge)
        edge *= 2
    return edges


def long_responses_only(groups: list[TraceGroup], min_tokens: int) -> list[TraceGroup]:
    """A fixed cohort: only responses of at least min_tokens (groups keep those siblings, empty groups go),
    so that every position bin below min_tokens holds steps of the same responses."""
    kept = [TraceGroup(g.prompt, [r for r in g.responses if len(r) >= min_tokens]) for g in groups]
    return [g for g in kept if g.responses]


def profile_entry(stats: ReplayStats) -> dict:
    """One method's per-bin numbers in the simulator's schema, plus totals."""
    return {
        "tokens_per_step": stats.by_position(),
        "drafted_per_step": stats.drafted_by_position(),
        "steps": stats.bin_steps.tolist(),
        "mean_tokens_per_step": stats.acceptance_length,
        "draft_efficiency": stats.draft_efficiency,
    }


def acceptance_profile(
    groups: list[TraceGroup],
    trace_set: str,
    k: int = 3,
    bin_edges: list[int] | None = None,
    methods: list[str] | None = None,
    log=print,
    revisits: bool = False,
) -> dict:
    """Replay every available method over the groups; the profile dict (see the module docstring).
    With `revisits`, the revisit proxy's methods over its current visits (`replay_revisits`)."""
    if bin_edges is None:
        bin_edges = power_of_two_edges(max(len(r) for g in groups for r in g.responses))
    run = replay_revisits if revisits else replay
    chosen = [m for m in (REVISIT_METHODS if revisits else METHODS) if methods is None or m.key in methods]
    out = {
        "k": k,
        "trace_set": trace_set,
        "bin_edges": list(bin_edges),
        "methods": {},
        "labels": {},
        "notes": [],
        "groups": len(groups),
        "responses": sum(len(g.responses) for g in groups),
        "response_tokens": sum(len(r) for g in groups for r in g.responses),
        "date": time.strftime("%Y-%m-%d"),
    }
    for m in chosen:
        if not m.available():
            out["notes"].append(f"{m.key} SKIPPED: {m.missing}")
            log(f"  {m.key:<20} SKIPPED: {m.missing}")
            continue
        t0 = time.perf_counter()
        stats = run(m.make(), groups, k, bin_edges=bin_edges)
        out["methods"][m.key] = profile_entry(stats)
        out["labels"][m.key] = m.label
        log(f"  {m.key:<20} {stats.acceptance_length:.3f} tokens/step ({time.perf_counter() - t0:.0f} s)")
    return out


def format_table(profile: dict) -> str:
    """Markdown table: methods x position bins (tokens per step), then the steps per bin."""
    edges = profile["bin_edges"]
    heads = [f"{lo}-{hi}" for lo, hi in zip(edges[:-1], edges[1:])] + [f"{edges[-1]}+"]
    lines = ["| method | mean | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    for key, r in profile["methods"].items():
        cells = ["-" if v is None else f"{v:.2f}" for v in r["tokens_per_step"]]
        lines.append(
            f"| {profile['labels'].get(key, key)} | {r['mean_tokens_per_step']:.3f} | " + " | ".join(cells) + " |"
        )
    if profile["methods"]:
        steps = next(iter(profile["methods"].values()))["steps"]
        lines.append("| (decode steps, first method) | | " + " | ".join(str(s) for s in steps) + " |")
    return "\n".join(lines)


def bin_midpoints(edges: list[int]) -> list[float]:
    """Where to draw each bin: its middle; the open-ended last bin at 1.5x its lower edge."""
    closed = [(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:])]
    return closed + [1.5 * edges[-1] if edges[-1] else FIRST_EDGE / 2]


def plot(profile: dict, path: Path, min_steps: int) -> None:
    """Tokens per step against the bin's lower edge (log2 axis), bins with at least min_steps steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centers = bin_midpoints(profile["bin_edges"])
    fig, ax = plt.subplots(figsize=(9, 5))
    for key, r in profile["methods"].items():
        points = [
            (x, v) for x, v, n in zip(centers, r["tokens_per_step"], r["steps"]) if v is not None and n >= min_steps
        ]
        if points:
            ax.plot(
                *zip(*points), marker="o", label=f"{profile['labels'].get(key, key)} ({r['mean_tokens_per_step']:.2f})"
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"position in response (tokens, bin middles; bins with >= {min_steps} decode steps)")
    ax.set_ylabel(f"mean tokens per decode step (k={profile['k']}, bonus included)")
    ax.set_title(
        f"Acceptance against context: {profile['trace_set']} "
        f"({profile['groups']} prompts, {profile['responses']} responses), honest lockstep"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DEFAULT_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "smollm2_dapo_T1.0_n8.npz"


def parse_args(argv: list[str] | None = None):
    import argparse

    p = argparse.ArgumentParser(description="Acceptance length against response position, per drafter (replay).")
    p.add_argument(
        "--traces", default=QWEN25MATH, help=f"'{QWEN25MATH}' or a trace file (.npz), e.g. {DEFAULT_FIXTURE}"
    )
    p.add_argument("--name", default=None, help="trace-set name in the JSON and file names (default: derived)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument(
        "--bin-edges",
        type=int,
        nargs="+",
        default=None,
        help="lower edges from 0 (default: 0, 128, 256, ... powers of two below the longest response)",
    )
    p.add_argument("--methods", nargs="+", choices=METHOD_KEYS, default=None, help="default: all available")
    p.add_argument(
        "--min-response-tokens",
        type=int,
        default=0,
        help="replay only responses at least this long (a fixed cohort across the bins below it)",
    )
    p.add_argument("--min-plot-steps", type=int, default=200, help="bins with fewer decode steps are not plotted")
    p.add_argument(
        "--revisits",
        action="store_true",
        help="the revisit proxy: each group's first 4 responses are an earlier visit, replayed one epoch before",
    )
    p.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    import json

    args = parse_args(argv)
    name, groups = load_trace_set(args.traces)
    if args.min_response_tokens:
        groups = long_responses_only(groups, args.min_response_tokens)
        name = f"{name}_min{args.min_response_tokens}"
    if args.revisits:
        name = f"{name}_revisits"
    name = args.name or name
    print(
        f"{name}: {len(groups)} groups, {sum(len(g.responses) for g in groups)} responses, "
        f"{sum(len(r) for g in groups for r in g.responses)} response tokens; replaying (k={args.k}):",
        flush=True,
    )
    profile = acceptance_profile(groups, name, args.k, args.bin_edges, args.methods, revisits=args.revisits)
    profile["min_response_tokens"] = args.min_response_tokens
    print(format_table(profile))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"acceptance_{name}_k{args.k}"
    Path(f"{stem}.json").write_text(json.dumps(profile, indent=1))
    plot(profile, Path(f"{stem}.png"), args.min_plot_steps)
    print(f"wrote {stem}.json and {stem}.png")
    return profile


if __name__ == "__main__":
    main()
