"""Replay benchmark: acceptance on real traces, the revisit proxy and drafting cost, every method in one run.

    python -m benchmarks.bench_replay [--groups N] [--out results/] [--traces qwen25math|FILE.npz]

Prints tables, writes replay_<trace set>.json and .png under --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from sam_rollout.drafter import DraftConfig
from sam_rollout.drafter.config import COUNTED_CONTINUATIONS as COUNTED

from . import speed
from .drafters import ArcticSuffixDrafter, SamDrafter, VllmNgramDrafter, arctic_available, vllm_available
from .replay import replay, replay_revisits, with_replaced_tokens
from .traces import QWEN25MATH, load_trace_set

HISTORY_TOKENS = 1 << 21  # 2M tokens: more than the traces hold, so nothing is evicted here
SMALL_HISTORY = 1 << 16  # 64k tokens: less than one epoch of either trace set (the revisit proxy)
MIN_PLOTTED_STEPS = 1000  # position bins with fewer decode steps are too noisy to plot
DEFAULT_CONTINUATION = DraftConfig().continuation
DEFAULT = f"SAM group + history, {DEFAULT_CONTINUATION} (default)"
FIRST = "SAM group + history, first occurrence"
STORE = f"{DEFAULT_CONTINUATION}, 64k history + prompt store (default + store)"
NO_STORE = f"{DEFAULT_CONTINUATION}, 64k history"
DRIFT_RATES = (0.05, 0.2)
SPEED_CONTEXTS = (1024, 8192, 32768)
SPEED_REPEATS = 5
CONFIDENCE_REACH = 8  # the confidence length's own cap in the extra rows (the others draft at most k)
LONG_CAP = 16  # the match length's cap in its extra rows, next to the fixed length at the same cap


def sam_methods() -> list[SamDrafter]:
    first = dict(continuation="first")
    gh = dict(group_aware=True, history_tokens=HISTORY_TOKENS)
    methods = [
        SamDrafter("SAM own context, first occurrence", DraftConfig(group_aware=False, **first)),
        SamDrafter("SAM group-aware, first occurrence", DraftConfig(group_aware=True, **first)),
        SamDrafter(
            "SAM own + history, first occurrence",
            DraftConfig(group_aware=False, history_tokens=HISTORY_TOKENS, **first),
        ),
        SamDrafter(FIRST, DraftConfig(**gh, **first)),
        SamDrafter("SAM group + history, first, min match 2", DraftConfig(**gh, **first, min_match=2)),
        SamDrafter("SAM group + history, first, scaled length", DraftConfig(**gh, **first, length_policy="scaled")),
    ]
    for c in COUNTED:
        group_history = DEFAULT if c == DEFAULT_CONTINUATION else f"SAM group + history, {c}"
        methods += [
            SamDrafter(f"SAM own context, {c}", DraftConfig(group_aware=False, continuation=c)),
            SamDrafter(f"SAM group-aware, {c}", DraftConfig(group_aware=True, continuation=c)),
            SamDrafter(group_history, DraftConfig(**gh, continuation=c)),
            SamDrafter(f"SAM group + history, {c}, min match 2", DraftConfig(**gh, continuation=c, min_match=2)),
            SamDrafter(
                f"SAM group + history, {c}, scaled length", DraftConfig(**gh, continuation=c, length_policy="scaled")
            ),
        ]
    frequent = dict(continuation="frequent")  # the confidence length reads counts: frequent only
    for p in (0.05, 0.1, 0.2, 0.3):
        config = DraftConfig(**gh, **frequent, length_policy="confidence", min_token_prob=p)
        methods.append(SamDrafter(f"SAM group + history, frequent, confidence {p:g}", config))
    for policy in ("match", "fixed"):  # long drafts: the match length against k tokens at every match
        config = DraftConfig(**gh, k=LONG_CAP, length_policy=policy)
        name = f"{DEFAULT}, {policy} length, cap {LONG_CAP}"
        methods.append(SamDrafter(name, config, max_draft=LONG_CAP))
    for p in (0.03, 0.05, 0.1, 0.2, 0.3):  # the same, allowed to reach CONFIDENCE_REACH tokens where it is sure
        config = DraftConfig(**gh, **frequent, k=CONFIDENCE_REACH, length_policy="confidence", min_token_prob=p)
        name = f"SAM group + history, frequent, confidence {p:g}, up to {CONFIDENCE_REACH}"
        methods.append(SamDrafter(name, config, max_draft=CONFIDENCE_REACH))
    return methods


def revisit_methods(notes: list[str]) -> list:
    small = dict(group_aware=True, history_tokens=SMALL_HISTORY)
    methods = [
        SamDrafter(
            "first, 2M history (holds the earlier epoch)",
            DraftConfig(group_aware=True, history_tokens=HISTORY_TOKENS, continuation="first"),
        ),
        SamDrafter("first, 64k history", DraftConfig(**small, continuation="first")),
        SamDrafter("first, 64k history + prompt store", DraftConfig(**small, continuation="first", prompt_store=True)),
    ]
    for c in COUNTED:
        with_store = STORE if c == DEFAULT_CONTINUATION else f"{c}, 64k history + prompt store"
        methods += [
            SamDrafter(f"{c}, no history", DraftConfig(group_aware=True, continuation=c)),
            SamDrafter(f"{c}, 64k history", DraftConfig(**small, continuation=c)),
            SamDrafter(with_store, DraftConfig(**small, continuation=c, prompt_store=True)),
        ]
    for policy in ("match", "fixed"):
        config = DraftConfig(**small, k=LONG_CAP, length_policy=policy, prompt_store=True)
        methods.append(SamDrafter(f"{STORE}, {policy} length, cap {LONG_CAP}", config, max_draft=LONG_CAP))
    if arctic_available():
        methods.append(ArcticSuffixDrafter())
    else:
        notes.append("revisit proxy: Arctic suffix decoding SKIPPED (arctic_inference is not importable)")
    return methods


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
        stats = replay(method, groups, getattr(method, "max_draft", None) or k)
        results[method.name] = stats.as_dict() | {"replay_seconds": time.perf_counter() - t0}
        print(f"  {method.name:<52} {stats.acceptance_length:.3f}", flush=True)
    return results


def run_revisits(groups, k: int, notes: list[str]) -> dict:
    """The epoch-spaced revisit proxy (`replay_revisits`): current visits only; the prompt store's
    statistics where it is on; and the default + store again with the earlier visits' tokens partly
    replaced (a crude drift proxy)."""
    results = {}
    runs = [(m, groups, m.name) for m in revisit_methods(notes)]
    for rate in DRIFT_RATES:
        drifted = with_replaced_tokens(groups, rate)
        for config, name in (
            (DraftConfig(group_aware=True, history_tokens=SMALL_HISTORY), NO_STORE),
            (DraftConfig(group_aware=True, history_tokens=SMALL_HISTORY, prompt_store=True), STORE),
        ):
            label = f"{name}, earlier visit {rate:.0%} replaced"
            runs.append((SamDrafter(label, config), drifted, label))
    for method, run_groups, label in runs:
        stats = replay_revisits(method, run_groups, getattr(method, "max_draft", None) or k)
        row = stats.as_dict()
        store = getattr(getattr(method, "drafter", None), "prompt_store", None)
        if store is not None:
            row["prompt_store"] = store.stats().as_dict()
        results[label] = row
        print(f"  {label:<68} {stats.acceptance_length:.3f}", flush=True)
    return results


def run_speed(groups, notes: list[str]) -> dict:
    """Drafter cost per request-step on the engine's path (`SamStepper.step`), the first-occurrence and
    the counted policies side by side in every step (own context, speed.sam_step_us), the default's
    drafter calls alone (`_sync_propose`) and fused (`_fused`, `BatchDrafter.step`) beside them;
    SPEED_REPEATS windows: the median (`contexts`) and the range (`ranges`). `..._vs_first` is the
    median per-step ratio to the first occurrence, `..._vs_fused` the stepper's time over the fused
    call's in the same steps: unlike the microseconds, the ratios carry over between machines."""
    corpus = np.concatenate([r for g in groups for r in g.responses])
    policies = {c: DraftConfig(group_aware=False, continuation=c) for c in ("first", *COUNTED)}
    small_pages = frozenset({"first_4k_pages", f"{DEFAULT_CONTINUATION}_4k_pages"})  # sam_rollout.drafter.pages off
    for name in sorted(small_pages):
        policies[name] = policies[name.removesuffix("_4k_pages")]
    fused, calls = f"{DEFAULT_CONTINUATION}_fused", f"{DEFAULT_CONTINUATION}_sync_propose"
    paths = {fused: speed.FUSED, calls: speed.DRAFTER_CALLS}
    for name in paths:
        policies[name] = policies[DEFAULT_CONTINUATION]
    notes.append(f"SAM timed through SamStepper.step (switch always), except {fused} and {calls}")
    out: dict = {"contexts": {}, "ranges": {}, "build": {}, "repeats": SPEED_REPEATS}
    for context in SPEED_CONTEXTS:
        runs: dict[str, list[float]] = {}
        for repeat in range(SPEED_REPEATS):
            for batch in (64, 8, 1):
                timed = speed.sam_step_us(
                    corpus,
                    context,
                    batch=batch,
                    configs=policies,
                    seed=repeat,
                    small_pages=small_pages,
                    paths=paths,
                )
                for name, t in timed.items():
                    runs.setdefault(f"sam_{name}_batch{batch}_us", []).append(t["us"])
                    if batch == 64 and name != "first":
                        runs.setdefault(f"sam_{name}_batch64_vs_first", []).append(t["ratio"])
                engine_over_fused = timed[DEFAULT_CONTINUATION]["us"] / timed[fused]["us"]
                runs.setdefault(f"sam_{DEFAULT_CONTINUATION}_batch{batch}_vs_fused", []).append(engine_over_fused)
        row = {key: float(np.median(v)) for key, v in runs.items()}
        out["ranges"][str(context)] = {key: [min(v), max(v)] for key, v in runs.items()}
        if vllm_available():
            row["vllm_ngram_5_5_us"] = speed.vllm_ngram_step_us(corpus, context)
        if arctic_available():
            row["arctic_us"] = speed.arctic_step_us(corpus, context)
        out["contexts"][str(context)] = row
        print(f"  context {context}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    for name, config in policies.items():
        if name.endswith(("_4k_pages", "_fused", "_sync_propose")):
            continue  # the same build
        us, bytes_per_token = speed.sam_build(corpus, 32768, config=config)
        out["build"][name] = {"tokens": 32768, "us_per_token": us, "bytes_per_token": bytes_per_token}
    return out


def _acceptance_table(title: str, results: dict) -> None:
    labels = list(next(iter(results.values()))["by_position"])
    print(f"\n{title}")
    print(f"{'method':<70}{'mean':>7}{'eff':>7}{'drafted':>9}" + "".join(f"{b:>10}" for b in labels))
    for name, r in results.items():
        cells = "".join(f"{v:>10.2f}" if v is not None else f"{'-':>10}" for v in r["by_position"].values())
        print(
            f"{name:<70}{r['acceptance_length']:>7.3f}{r['draft_efficiency']:>7.2f}{r['drafted_per_step']:>9.2f}{cells}"
        )
    steps = next(iter(results.values()))["steps_by_position"].values()
    print(f"{'(decode steps in the bin)':<93}" + "".join(f"{n:>10}" for n in steps))


def print_tables(acceptance: dict, revisits: dict, speed_results: dict) -> None:
    _acceptance_table("Acceptance length (tokens per decode step, bonus included), k=3, honest lockstep", acceptance)
    _acceptance_table("Revisit proxy (current visits only; earlier visits replayed one epoch before)", revisits)
    store = revisits[STORE].get("prompt_store")
    if store:
        print(
            f"prompt store after the proxy: {store['prompts']} prompts, {store['responses']} responses, "
            f"{store['tokens']} tokens, {store['nbytes']} bytes ({store['nbytes'] / max(store['prompts'], 1):.0f} "
            f"per prompt); hits {store['hits']}, misses {store['misses']}"
        )
    if not speed_results["contexts"]:
        return
    print(
        f"\nDrafting cost per request-step (append 1-4 tokens, propose 3), median of {SPEED_REPEATS} windows: us, "
        "and (_vs_first) the ratio to the first occurrence in the same steps"
    )
    rows = speed_results["contexts"]
    keys = list(next(iter(rows.values())).keys())
    print(f"{'context':<9}" + "".join(f"{k:>24}" for k in keys))
    for ctx, row in rows.items():
        print(f"{ctx:<9}" + "".join(f"{row[k]:>24.2f}" for k in keys))
    for name, b in speed_results["build"].items():
        print(
            f"Build from scratch ({name}): {b['us_per_token']:.3f} us/token; memory {b['bytes_per_token']:.1f} "
            f"bytes/token ({b['tokens']} tokens)"
        )


def target_checks(acceptance: dict, revisits: dict, speed_results: dict) -> dict:
    """The acceptance issue's targets that this trace set can check (True = met)."""
    acc = {name: r["acceptance_length"] for name, r in acceptance.items()}
    checks = {}
    if "Arctic suffix decoding" in acc:
        checks["group + history (default) >= Arctic + 0.03"] = acc[DEFAULT] >= acc["Arctic suffix decoding"] + 0.03
    store, no_store = revisits[STORE]["acceptance_length"], revisits[NO_STORE]["acceptance_length"]
    checks["revisit proxy, 64k history + prompt store >= 3.0 (the Qwen target)"] = store >= 3.0
    checks["revisit proxy: prompt store no worse than without"] = store >= no_store
    if speed_results["contexts"]:
        checks["default drafter <= 1.5 us per request-step at 32k, batch 64"] = (
            speed_results["contexts"]["32768"][f"sam_{DEFAULT_CONTINUATION}_batch64_us"] <= 1.5
        )
        checks["<= 64 bytes/token"] = speed_results["build"][DEFAULT_CONTINUATION]["bytes_per_token"] <= 64
    return checks


def plot(acceptance: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(acceptance.values()))
    keep = [b for b, n in first["steps_by_position"].items() if n >= MIN_PLOTTED_STEPS]
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, r in acceptance.items():
        if any(word in name for word in ("min match", "scaled", "confidence")):
            continue  # the length policies crowd the plot; they are in the table and the JSON
        values = [np.nan if r["by_position"][b] is None else r["by_position"][b] for b in keep]
        ax.plot(keep, values, marker="o", label=f"{name} ({r['acceptance_length']:.2f})")
    ax.set_xlabel(f"position in response (tokens; bins with >= {MIN_PLOTTED_STEPS} decode steps)")
    ax.set_ylabel("mean acceptance length (k=3, bonus included)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speed_only(groups, out: Path, notes: list[str]) -> dict:
    speed_results = run_speed(groups, notes)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine()}
    report |= {"speed": speed_results, "notes": notes}
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay_speed.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'replay_speed.json'}")
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=None, help="replay only the first N groups")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--speed-only", action="store_true", help="only the timings (replay_speed.json)")
    parser.add_argument("--traces", default=QWEN25MATH, help=f"'{QWEN25MATH}' (shared traces) or a trace file (.npz)")
    args = parser.parse_args(argv)
    notes: list[str] = []
    print(f"Loading traces {args.traces} ...", flush=True)
    trace_set, groups = load_trace_set(args.traces, args.groups)
    print(f"{len(groups)} groups, {sum(len(r) for g in groups for r in g.responses)} response tokens")
    if args.speed_only:
        return speed_only(groups, args.out, notes)
    print("Replaying (mean acceptance length):", flush=True)
    acceptance = run_acceptance(groups, args.k, notes)
    print("Revisit proxy (mean acceptance length of the current visits):", flush=True)
    revisits = run_revisits(groups, args.k, notes)
    speed_results = {"contexts": {}, "build": {}}
    if not args.skip_speed:
        print("Timing:", flush=True)
        speed_results = run_speed(groups, notes)
    print_tables(acceptance, revisits, speed_results)
    checks = target_checks(acceptance, revisits, speed_results)
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
        "revisits": revisits,
        "speed": speed_results,
        "targets": checks,
        "notes": notes,
    }
    stem = f"replay_{trace_set}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    title = f"Replay of {trace_set} ({len(groups)} prompts), honest lockstep"
    plot(acceptance, args.out / f"{stem}.png", title)
    print(f"wrote {args.out / stem}.json and .png")
    return report


if __name__ == "__main__":
    main()
