"""Greedy against sampled: how much acceptance falls from greedy decoding to T=1.0 on the same prompts.

    python -m benchmarks.generate_traces --prompts 320 --n 1 --temperature 0 --max-tokens 1024 \
        --out results/smollm2_dapo_greedy_p320.npz
    python -m benchmarks.generate_traces --prompts 320 --n 1 --temperature 1.0 --max-tokens 1024 \
        --out results/smollm2_dapo_T1.0_p320.npz
    python -m benchmarks.sampling_gap --greedy results/smollm2_dapo_greedy_p320.npz \
        --sampled results/smollm2_dapo_T1.0_p320.npz

Both trace sets are replayed as the long traces' first visits (`benchmarks.long_replay`): each response as a group
of its own, drafting from its own text and a history of the responses before it; sample j of every prompt in
pass j, so that no history holds a sibling. Finished responses (finish reason "stop") count; those cut at
max_tokens are reported apart. Per position bin, the gain's ratio (sampled tokens per step - 1) / (greedy - 1)
says how much of the greedy gain survives sampling; `carry` applies it to a greedy acceptance profile (the long
traces'), past the last measured bin with that bin's ratio, and its range (over the bins with >= MIN_STEPS steps
in both sets, and the methods) gives the low and high profiles.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from testkit.data import TraceGroup

from .draft_length import rounded
from .long_replay import METHODS, Method
from .replay import ReplayStats, bin_labels, replay
from .traces import read_traces

BINS = (0, 128, 256, 512, 1024, 2048)
CAPS = (3, 16)
COMPARED = ("sam", "arctic")
MIN_STEPS = 1000  # bins with fewer steps in either set do not set the ratio
TRACE_SETTINGS = ("model", "dtype", "engine", "temperature", "n", "max_tokens", "seed", "prompts_requested")


def passes(path: Path, finished: bool) -> list[list[TraceGroup]]:
    """Pass j: sample j of every prompt that has one (finished, or cut at max_tokens), as a group of its own."""
    groups, _ = read_traces(path)
    width = max(len(g.responses) for g in groups)
    return [
        [
            TraceGroup(g.prompt, [g.responses[j]])
            for g in groups
            if j < len(g.responses) and (g.finish_reasons[j] == "stop") == finished
        ]
        for j in range(width)
    ]


def replay_passes(method: Method, cap: int, sets: list[list[TraceGroup]]) -> ReplayStats:
    total = ReplayStats(bin_edges=BINS)
    for groups in sets:
        total.add(replay(method.make(cap, False), groups, cap, bin_edges=BINS))
    return total


def gain_ratios(greedy: dict, sampled: dict) -> list[float | None]:
    """Per bin: (sampled - 1) / (greedy - 1), None where either set has fewer than MIN_STEPS steps."""
    out = []
    for label in greedy["by_position"]:
        g, s = greedy["by_position"][label], sampled["by_position"][label]
        enough = min(greedy["steps_by_position"][label], sampled["steps_by_position"][label]) >= MIN_STEPS
        out.append((s - 1.0) / (g - 1.0) if enough and g is not None and s is not None and g > 1.0 else None)
    return out


def run(greedy: Path, sampled: Path, log=print) -> dict:
    methods = [m for m in METHODS if m.key in COMPARED and m.available()]
    out: dict = {"finished": {}, "unfinished": {}}
    for finished in (True, False):
        sets = {"greedy": passes(greedy, finished), "sampled": passes(sampled, finished)}
        part = out["finished" if finished else "unfinished"]
        for cap in CAPS:
            for m in methods:
                row = {name: replay_passes(m, cap, s).as_dict() for name, s in sets.items()}
                row["gain_ratio"] = dict(zip(bin_labels(BINS), gain_ratios(row["greedy"], row["sampled"])))
                part.setdefault(str(cap), {})[m.key] = row
                log(
                    f"  {'finished' if finished else 'unfinished':<10} cap {cap:>2} {m.key:<8} greedy "
                    f"{row['greedy']['acceptance_length']:.3f}, T=1.0 {row['sampled']['acceptance_length']:.3f}; "
                    f"gain ratio by bin {[None if r is None else round(r, 2) for r in row['gain_ratio'].values()]}"
                )
    return out


def ratio_range(result: dict) -> dict:
    """Per cap: the gain ratios of the finished responses over the bins that set one and the methods compared;
    `last` is the furthest such bin's, per method (what positions past the measured ones take)."""
    out = {}
    for cap, row in result["finished"].items():
        ratios = [r for m in row.values() for r in m["gain_ratio"].values() if r is not None]
        last = {key: [r for r in m["gain_ratio"].values() if r is not None][-1:] for key, m in row.items()}
        out[cap] = {"low": min(ratios), "high": max(ratios), "last": last} if ratios else None
    return out


def carry(profile: dict, ratio: float, drafted_ratio: float = 1.0) -> dict:
    """A greedy acceptance profile (`benchmarks.acceptance_curves` schema) with every bin's gain scaled by `ratio`
    (tokens per step 1 + ratio x (greedy - 1)) and drafted tokens by `drafted_ratio`."""
    methods = {}
    for key, m in profile["methods"].items():
        methods[key] = m | {
            "tokens_per_step": [None if t is None else 1.0 + ratio * (t - 1.0) for t in m["tokens_per_step"]],
            "drafted_per_step": [None if d is None else d * drafted_ratio for d in m["drafted_per_step"]],
        }
    note = f"carried to sampling: gain x {ratio:.3f}, drafted x {drafted_ratio:.3f} (benchmarks.sampling_gap)"
    return profile | {"methods": methods, "notes": list(profile.get("notes", [])) + [note]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--greedy", type=Path, required=True, help="trace file (.npz) decoded greedily")
    p.add_argument("--sampled", type=Path, required=True, help="trace file (.npz) of the same prompts at T=1.0")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sampling_gap.json"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    result = run(args.greedy, args.sampled)
    settings = {name: read_traces(path)[1] for name, path in (("greedy", args.greedy), ("sampled", args.sampled))}
    report = {
        "bins": list(BINS),
        "min_steps": MIN_STEPS,
        "traces": {name: {k: s.get(k) for k in TRACE_SETTINGS} for name, s in settings.items()},
        "result": result,
        "ratio_range": ratio_range(result),
        "seconds": round(time.perf_counter() - t0),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(report), separators=(",", ":")))
    print(json.dumps(rounded(report["ratio_range"]), indent=1))
    print(f"wrote {args.out} ({report['seconds']} s)")
    return report


if __name__ == "__main__":
    main()
