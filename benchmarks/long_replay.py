"""Replay on the shared long reasoning traces: SAM against Arctic suffix decoding by response position.

    python -m benchmarks.long_replay [--caps 3 8 16] [--out benchmarks/results/long_replay.json]

The traces (`testkit.data.load_long_traces`) are greedy responses of Qwen2.5-based long-CoT models, one per model
and problem. Cases, each replayed in honest lockstep (`benchmarks.replay`) through one drafter per method:

- first visits: one finished response per prompt outside the checkpoint run (the first in file order), in file
  order: each drafts from its own text and the responses before it (SAM: a 4M-token history; Arctic: its
  global tree);
- revisits: the checkpoint run's finished responses, checkpoint by checkpoint in training order; the prompt
  store holds a prompt's responses at earlier checkpoints, the history every earlier response. Scored: the
  responses whose prompt answered at an earlier checkpoint;
- unfinished: one unfinished response per prompt (the first UNFINISHED_PROMPTS prompts), as the first visits,
  reported apart: most end in a loop that any suffix drafter predicts.

Steps are counted by response position (BINS) and by half: prompts alternate between "tune" and "held_out"
(first-visit order; revisits by sorted prompt id), so that a setting chosen on one half is checked on the other.
The JSON holds every method's `ReplayStats.as_dict()` per case, cap and half; `--profiles DIR` also writes the
rollout simulator's acceptance profiles (`benchmarks.acceptance_curves` schema) for the first visits and revisits.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sam_rollout.drafter import DraftConfig
from testkit.data import CHECKPOINT_RUN, LongTrace, TraceGroup, load_long_traces

from .acceptance_curves import profile_entry
from .draft_length import rounded
from .drafters import ArcticSuffixDrafter, SamDrafter, VllmSuffixDrafter, arctic_available, vllm_available
from .replay import ALL, replay_by_part, replay_visits

HISTORY_TOKENS = 1 << 22  # 4M: holds every first visit here (0.9M tokens), as an engine's history would a few steps
BINS = (0, 1024, 2048, 4096, 8192)
CAPS = (3, 8, 16)
HALVES = ("tune", "held_out")
UNFINISHED_PROMPTS = 100
CASES = ("first_visits", "revisits", "unfinished")
BASE_K = DraftConfig().base_k


@dataclass
class Method:
    key: str
    label: str
    make: Callable[[int, bool], object]  # (cap, revisits) -> a fresh drafter
    available: Callable[[], bool] = lambda: True
    long_only: bool = False  # a length variant: replayed at caps above BASE_K only (at BASE_K it is the default)
    variant: bool = False  # not replayed on the unfinished responses


def sam_method(key: str, label: str, long_only: bool = False, **settings) -> Method:
    """SAM with these DraftConfig settings at the cap; with the prompt store on revisits."""

    def make(cap: int, revisits: bool) -> SamDrafter:
        config = DraftConfig(k=cap, history_tokens=HISTORY_TOKENS, prompt_store=revisits, **settings)
        return SamDrafter(key, config)

    return Method(key, label, make, long_only=long_only, variant=long_only)


METHODS = [
    sam_method("sam", "SAM, defaults"),
    Method(
        "arctic",
        "Arctic suffix decoding (global tree, depth 24)",
        lambda c, r: ArcticSuffixDrafter(),
        arctic_available,
    ),
    Method("vllm_suffix", "vLLM's suffix method (its defaults)", lambda c, r: VllmSuffixDrafter(c), vllm_available),
    # Arctic allowed to draft longer from short matches (max_spec_factor; 1 drafts at most the match's length)
    *(
        Method(
            f"arctic_factor{f}",
            f"Arctic, max_spec_factor {f}",
            lambda c, r, f=f: ArcticSuffixDrafter(max_spec_factor=float(f)),
            arctic_available,
            variant=True,
        )
        for f in (2, 4)
    ),
    # draft-length variants for the recipes' choice (the simulator prices them)
    sam_method("sam_base4", "SAM, base_k 4", long_only=True, base_k=4),
    sam_method("sam_scale2", "SAM, match_scale 2", long_only=True, match_scale=2.0),
]


def first_visits(traces: list[LongTrace], finished: bool = True) -> tuple[list[TraceGroup], list[str]]:
    """One response per prompt outside the checkpoint run, finished or not, in file order; and each one's half."""
    seen: set[str] = set()
    groups = []
    for t in traces:
        if t.run == CHECKPOINT_RUN or t.finished != finished or t.prompt_id in seen:
            continue
        seen.add(t.prompt_id)
        groups.append(TraceGroup(t.prompt, [t.response]))
    return groups, [HALVES[i % 2] for i in range(len(groups))]


def checkpoint_visits(traces: list[LongTrace]) -> tuple[list[list[tuple[str, TraceGroup]]], dict[str, str]]:
    """The checkpoint run's finished responses as visits, one per checkpoint in training order; each prompt's half."""
    run = [t for t in traces if t.run == CHECKPOINT_RUN and t.finished]
    steps = sorted({t.checkpoint for t in run})
    visits = [[(t.prompt_id, TraceGroup(t.prompt, [t.response])) for t in run if t.checkpoint == s] for s in steps]
    prompts = sorted({t.prompt_id for t in run})
    return visits, {p: HALVES[i % 2] for i, p in enumerate(prompts)}


def run_case(case: str, method: Method, cap: int, traces: list[LongTrace]) -> dict:
    """One method at one cap on one case: stats per half and ALL."""
    if case == "revisits":
        visits, parts = checkpoint_visits(traces)
        stats = replay_visits(method.make(cap, True), visits, parts, cap, bin_edges=BINS)
    else:
        groups, halves = first_visits(traces, finished=case == "first_visits")
        if case == "unfinished":
            groups, halves = groups[:UNFINISHED_PROMPTS], halves[:UNFINISHED_PROMPTS]
        stats = replay_by_part(method.make(cap, False), groups, halves, cap, bin_edges=BINS)
    return {part: s.as_dict() | {"profile": profile_entry(s)} for part, s in stats.items()}


def run(traces: list[LongTrace], cases=CASES, caps=CAPS, methods=None, log=print) -> dict:
    chosen = [m for m in METHODS if methods is None or m.key in methods]
    out: dict = {}
    for case in cases:
        for cap in caps if case != "unfinished" else (min(caps), max(caps)):
            for m in chosen:
                if (m.long_only and cap <= BASE_K) or (m.variant and case == "unfinished"):
                    continue
                if not m.available():
                    log(f"  {case} cap {cap} {m.key}: SKIPPED (not importable)")
                    continue
                t0 = time.perf_counter()
                row = run_case(case, m, cap, traces)
                out.setdefault(case, {}).setdefault(str(cap), {})[m.key] = row
                bins = " ".join("-" if v is None else f"{v:.2f}" for v in row[ALL]["by_position"].values())
                log(
                    f"  {case:<12} cap {cap:>2} {m.key:<12} {row[ALL]['acceptance_length']:.3f} [{bins}] "
                    f"tune {row['tune']['acceptance_length']:.3f} held out {row['held_out']['acceptance_length']:.3f} "
                    f"({time.perf_counter() - t0:.0f} s)"
                )
    return out


def margins(results: dict, method: str = "sam", peer: str = "arctic") -> dict:
    """method - peer, tokens per step, per case, cap and half: overall and per bin (None where a bin is empty)."""
    out: dict = {}
    for case, caps in results.items():
        for cap, row in caps.items():
            if method not in row or peer not in row:
                continue
            for part in row[method]:
                a, b = row[method][part], row[peer][part]
                bins = {
                    label: None if x is None or y is None else x - y
                    for (label, x), y in zip(a["by_position"].items(), b["by_position"].values())
                }
                out.setdefault(case, {}).setdefault(cap, {})[part] = {
                    "mean": a["acceptance_length"] - b["acceptance_length"],
                    "by_position": bins,
                }
    return out


def format_table(results: dict, case: str, part: str = ALL) -> str:
    """Markdown: method x cap, mean and per bin."""
    caps = results[case]
    labels = list(next(iter(next(iter(caps.values())).values()))[part]["by_position"])
    lines = ["| cap | method | mean | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
    for cap, row in caps.items():
        for key, r in row.items():
            cells = ["-" if v is None else f"{v:.2f}" for v in r[part]["by_position"].values()]
            lines.append(f"| {cap} | {key} | {r[part]['acceptance_length']:.3f} | " + " | ".join(cells) + " |")
    steps = next(iter(next(iter(caps.values())).values()))[part]["steps_by_position"].values()
    lines.append("| | (decode steps) | | " + " | ".join(str(s) for s in steps) + " |")
    return "\n".join(lines)


def write_profiles(results: dict, directory: Path) -> list[Path]:
    """The simulator's acceptance profiles: first visits and revisits, one file per cap, every method."""
    paths = []
    for case in ("first_visits", "revisits"):
        for cap, row in results.get(case, {}).items():
            profile = {
                "k": int(cap),
                "trace_set": f"long_cot_{case}",
                "bin_edges": list(BINS),
                "methods": {key: r[ALL]["profile"] for key, r in row.items()},
                "labels": {m.key: m.label for m in METHODS if m.key in row},
                "notes": ["greedy long-CoT traces (benchmarks.long_replay), finished responses"],
                "date": time.strftime("%Y-%m-%d"),
            }
            path = directory / f"acceptance_long_cot_{case}_k{cap}.json"
            path.write_text(json.dumps(rounded(profile), indent=1))
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--caps", type=int, nargs="+", default=list(CAPS))
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--methods", nargs="+", choices=[m.key for m in METHODS], default=None)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/long_replay.json"))
    p.add_argument("--profiles", type=Path, default=None, help="write the simulator's acceptance profiles here")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    traces = load_long_traces()
    results = run(traces, args.cases, args.caps, args.methods)
    for case in results:
        print(f"\n{case} (all prompts):\n{format_table(results, case)}")
    report = {
        "bins": list(BINS),
        "history_tokens": HISTORY_TOKENS,
        "labels": {m.key: m.label for m in METHODS},
        "sam_config": str(DraftConfig()),
        "results": results,
        "sam_minus_arctic": margins(results),
        "seconds": round(time.perf_counter() - t0),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.profiles is not None:
        args.profiles.mkdir(parents=True, exist_ok=True)
        for path in write_profiles(results, args.profiles):
            print(f"wrote {path}")
    for case in results.values():  # the profiles have their own files
        for row in case.values():
            for r in row.values():
                for part in r.values():
                    part.pop("profile")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(report), separators=(",", ":")))
    print(f"wrote {args.out} ({report['seconds']} s)")
    return report


if __name__ == "__main__":
    main()
