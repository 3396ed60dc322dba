"""Choose the frequent policy's settings on half of the prompts, report them on the other half.

    python -m benchmarks.policy_split [--traces qwen25math benchmarks/fixtures/smollm2_dapo_T1.0_n8.npz]

Both trace sets are split by prompt: even-numbered groups tune, odd-numbered ones are held out. On
each half every candidate (first occurrence, and the frequent and adaptive continuations over a grid
of long_match x count_prior x recency_weight) replays group + history in honest lockstep next to Arctic's suffix
decoding. The rule, fixed before looking: on the tuning halves, take the candidate that beats Arctic
by >= TARGET_MARGIN on the most trace sets, then the one with the largest smallest margin. The held-out halves and the
full sets are reported for every candidate, so the choice can be checked, not just trusted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sam_rollout.drafter import DraftConfig
from sam_rollout.drafter.config import COUNTED_CONTINUATIONS as COUNTED

from .drafters import ArcticSuffixDrafter, SamDrafter
from .replay import replay
from .traces import QWEN25MATH, load_trace_set

HISTORY_TOKENS = 1 << 21  # as in bench_replay: more than the traces hold
TARGET_MARGIN = 0.03  # the target: group + history >= Arctic + 0.03
LONG_MATCHES = (4, 8, 16)
COUNT_PRIORS = (1.0, 2.0, 4.0)
RECENCY_WEIGHTS = (1.0, 1.5, 2.0)
SMOLLM2 = str(Path(__file__).resolve().parent / "fixtures" / "smollm2_dapo_T1.0_n8.npz")
HALVES = {"tune": slice(0, None, 2), "held_out": slice(1, None, 2), "all": slice(None)}


def candidates() -> dict[str, DraftConfig]:
    out = {"first": DraftConfig(history_tokens=HISTORY_TOKENS, continuation="first")}
    for continuation in COUNTED:
        for long_match in LONG_MATCHES:
            for prior in COUNT_PRIORS:
                for recency in RECENCY_WEIGHTS:
                    out[f"{continuation}, long_match {long_match}, prior {prior:g}, recency {recency:g}"] = DraftConfig(
                        history_tokens=HISTORY_TOKENS,
                        continuation=continuation,
                        long_match=long_match,
                        count_prior=prior,
                        recency_weight=recency,
                    )
    return out


def margins(results: dict, half: str, name: str) -> list[float]:
    """Candidate `name` minus Arctic, per trace set, on one half."""
    return [r[half][name] - r[half]["arctic"] for r in results.values()]


def choose(results: dict) -> str:
    """The rule in the module docstring, on the tuning halves."""

    def key(name):
        m = margins(results, "tune", name)
        return (sum(x >= TARGET_MARGIN for x in m), min(m))

    return max(candidates(), key=key)


def run(trace_sources: list[str], k: int = 3, log=print) -> dict:
    results = {}
    for source in trace_sources:
        name, groups = load_trace_set(source)
        results[name] = {}
        for half, part in HALVES.items():
            sub = groups[part]
            row = {"arctic": replay(ArcticSuffixDrafter(), sub, k).acceptance_length}
            for label, config in candidates().items():
                row[label] = replay(SamDrafter(label, config), sub, k).acceptance_length
            results[name][half] = row
            log(f"  {name} {half} ({len(sub)} groups): arctic {row['arctic']:.3f}, first {row['first']:.3f}")
    return results


def format_table(results: dict, chosen: str) -> str:
    sets = list(results)
    heads = [f"{s} {h}" for s in sets for h in HALVES]
    lines = ["| candidate | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for name in ["arctic", *candidates()]:
        cells = [f"{results[s][h][name]:.3f}" for s in sets for h in HALVES]
        label = f"**{name}** (chosen)" if name == chosen else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=[QWEN25MATH, SMOLLM2])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/policy_split.json"))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    results = run(args.traces, args.k)
    chosen = choose(results)
    print(format_table(results, chosen))
    for half in ("tune", "held_out", "all"):
        m = ", ".join(f"{x:+.3f}" for x in margins(results, half, chosen))
        print(f"chosen '{chosen}': margin over Arctic on {half}: {m} ({', '.join(results)})")
    print(f"({time.perf_counter() - t0:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"k": args.k, "chosen": chosen, "results": results}, indent=1))
    return {"chosen": chosen, "results": results}


if __name__ == "__main__":
    main()
