"""SAM's device-side drafting on real text: does drafting beside the device keep synchronous drafting's gain?

    python -m benchmarks.device_drafts_replay [--sets qwen25math,long_first,long_revisit] [--caps 3,16]
        [--rows 16] [--json benchmarks/results/device_drafts_replay_DATE.json]

Each set runs through the engine-free harness (``testkit.simulated_device.AsyncHarness``): SAM's Model Runner
V2 speculator, its drafting thread and device ops on a device thread that the host runs ahead of, every
request a real response that the emulated model emits token for token (greedy replay), ``--rows`` requests
at a time. The harness's synchronous reference (a ``SamStepper`` called after each step with the same
tokens) gives what synchronous drafting sends on the same steps; the device's drafts are compared with it
at every step, and tokens per decode step are counted by response position for both.

Sets: ``qwen25math`` (the shared Qwen2.5-Math traces, 100 prompts x 8 sampled responses, two groups at a
time), ``long_first`` (the long traces' finished first visits, benchmarks.long_replay.first_visits, with
history) and ``long_revisit`` (the checkpoint series, one checkpoint a wave, through the prompt store).
Caps: 3, and 16 with the match-scaled length. As on Model Runner V2, every row verifies the step's full
width, its slots past SAM's draft filled with its last token.

Beside it, for scale, the standard lockstep replay (``benchmarks.replay``) of synchronous SAM (the same
settings) and of Arctic suffix decoding on the same texts.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import numpy as np

from benchmarks.drafters import ArcticSuffixDrafter, SamDrafter, arctic_available
from benchmarks.long_replay import BINS as LONG_BINS
from benchmarks.long_replay import HISTORY_TOKENS, checkpoint_visits, first_visits
from benchmarks.replay import POSITION_BINS, ReplayStats, replay, replay_visits
from sam_rollout.drafter import DraftConfig
from testkit.data import load_long_traces, load_trace_groups
from testkit.simulated_device import AsyncHarness, SimulatedStream, Workload

SETS = ("qwen25math", "long_first", "long_revisit")
CAPS = (3, 16)


def sam_spec(cap: int, revisit: bool) -> dict:
    """SAM's settings: always drafting (the width of a Model Runner V2 step); cap 16 with match scaling."""
    spec = dict(switch=None, history_tokens=HISTORY_TOKENS, prompt_store=revisit)
    if cap > 3:
        spec["length_policy"] = "match"
    return spec


def draft_config(cap: int, revisit: bool) -> DraftConfig:
    spec = sam_spec(cap, revisit)
    spec.pop("switch")
    return DraftConfig(k=cap, **spec)


def texts(name: str, limit: int | None):
    """(prompts, responses, waves, bins, replay input) of a set."""
    if name == "qwen25math":
        groups = load_trace_groups(limit)
        prompts = [g.prompt for g in groups for _ in g.responses]
        responses = [r for g in groups for r in g.responses]
        waves = [i // 2 for i, g in enumerate(groups) for _ in g.responses]  # two groups of siblings at a time
        return prompts, responses, waves, POSITION_BINS, groups
    traces = load_long_traces()
    if name == "long_first":
        groups, _ = first_visits(traces)
        groups = groups[:limit]
        return [g.prompt for g in groups], [g.responses[0] for g in groups], None, LONG_BINS, groups
    visits, parts = checkpoint_visits(traces)
    flat = [(w, group) for w, visit in enumerate(visits) for _, group in visit][:limit]
    return (
        [g.prompt for _, g in flat],
        [g.responses[0] for _, g in flat],
        [w for w, _ in flat],
        LONG_BINS,
        (visits, parts),
    )


def harness_stats(harness: AsyncHarness, bins) -> ReplayStats:
    """Tokens per decode step of the harness run by response position (the prefill step excluded, tokens
    past a response's end not counted), from its step records and the device's committed counts."""
    stats = ReplayStats(bin_edges=tuple(bins))
    done, verified = {}, {}
    counts = iter(s.cpu().numpy() for s in harness.sampled)
    for record in harness.steps:
        if not record.req_ids:
            continue
        for rid, count in zip(record.req_ids, next(counts).tolist()):
            length = len(harness.w.responses[int(rid)])
            position = done.get(rid, 0)
            if 0 < position < length:
                emitted = min(count, length - position)
                accepted = emitted - 1 if emitted == count else emitted  # the last token: the bonus, or cut
                stats.record(position, verified.get(rid, 0), accepted, emitted)
            done[rid] = position + count
            verified[rid] = record.width
    return stats


def run_harness(name: str, cap: int, rows: int, limit: int | None, log=print) -> dict:
    prompts, responses, waves, bins, _ = texts(name, limit)
    harness = AsyncHarness(
        Workload.texts(prompts, responses, waves),
        cap,
        sam_spec(cap, name == "long_revisit"),
        SimulatedStream(),
        max_rows=rows,
    )
    t0 = time.perf_counter()
    try:
        harness.run()
        received = [x.numpy() for x in harness.received]
        reference = harness.reference_drafts()
    finally:
        harness.close()
    differ = [i for i, (a, b) in enumerate(zip(reference, received)) if not np.array_equal(a, b)]
    stats = harness_stats(harness, bins)
    log(f"  {name} cap {cap}: harness {stats.acceptance_length:.3f} tokens/step, {len(received)} steps, "
        f"{len(differ)} differ from synchronous drafting ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return dict(
        steps=len(received),
        steps_differing_from_synchronous=len(differ),
        first_differing_step=differ[0] if differ else None,
        device_drafts=stats.as_dict(),
        # the reference sends the same drafts on the same steps, so its tokens per step are these; the share
        # of synchronous drafting's gain kept: (device - 1) / (synchronous - 1)
        share_of_synchronous_gain=1.0 if not differ and len(reference) == len(received) else None,
    )


def run_replays(name: str, cap: int, limit: int | None) -> dict:
    """The standard lockstep replay of synchronous SAM and of Arctic on the same texts."""
    *_, bins, data = texts(name, limit)
    drafters = {"sam_synchronous": lambda: SamDrafter("sam", draft_config(cap, name == "long_revisit"))}
    if arctic_available():
        drafters["arctic"] = lambda: ArcticSuffixDrafter()
    out = {}
    for key, make in drafters.items():
        if name == "long_revisit":
            visits, parts = data
            stats = replay_visits(make(), visits, parts, cap, bin_edges=bins)["all"]
        else:
            stats = replay(make(), data, cap, bin_edges=bins)
        out[key] = stats.as_dict()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--caps", default=",".join(map(str, CAPS)))
    p.add_argument("--rows", type=int, default=16, help="requests in flight (batch rows)")
    p.add_argument("--limit", type=int, help="first N groups/responses of each set (a quick run)")
    p.add_argument("--json", type=Path, default=Path(f"benchmarks/results/device_drafts_replay_{date.today()}.json"))
    args = p.parse_args(argv)
    sets, caps = args.sets.split(","), [int(c) for c in args.caps.split(",")]
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        p.error(f"unknown sets {unknown}; choose from {SETS}")
    out = dict(rows=args.rows, limit=args.limit, results={})
    for name in sets:
        for cap in caps:
            row = run_harness(name, cap, args.rows, args.limit)
            row["replay"] = run_replays(name, cap, args.limit)
            out["results"].setdefault(name, {})[str(cap)] = row
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
