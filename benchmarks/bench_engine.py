"""Engine benchmark (not part of the tests): one GRPO-like workload under several speculative settings.

    python -m benchmarks.bench_engine                               # 16 DAPO prompts x n=4, T=1, + 16 greedy, 1024 tok
    python -m benchmarks.bench_engine --prompts 4 --greedy-prompts 4 --max-tokens 256 --json results/engine-quick.json
    python -m benchmarks.bench_engine --settings none sam sam_group     # a subset

    python -m benchmarks.bench_engine --lengths lognormal --median-tokens 128 --max-tokens 512 \
        --settings none ngram sam_thr8_group sam_schedule_cpu sam_auto   # equal work with a long tail

Settings (testkit/engine.py SETTINGS): none, ngram, suffix (skipped when arctic_inference is not
importable), sam (threshold null, group_aware false), sam_thr8 (threshold 8, group_aware false),
sam_group (threshold null, group_aware true), sam_auto (the online switch); not run by default:
sam_thr8_group (threshold 8, group_aware true), sam_schedule_cpu (the offline-derived CPU schedule),
sam_k0 (configured, never drafting), sam_min5. k=3 everywhere. --lengths lognormal draws each sampled
request's length once and generates exactly that many tokens in every setting (equal work). Every
setting runs in this one process, one after another, on a fresh engine with the same engine arguments;
--repeats N runs the list N times, every other round reversed, and reports ratios per round.
Prints a markdown table and writes the JSON report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testkit import engine as be  # imports no vLLM

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16, help="prompts in the sampled part (0 = none)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt in the sampled part")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--greedy-prompts", type=int, default=16, help="prompts in the greedy part (0 = none)")
    ap.add_argument("--offset", type=int, default=0, help="first DAPO-Math-17k row")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    ap.add_argument("--lengths", choices=be.LENGTHS, default="fixed", help="lognormal: drawn per request, EOS ignored")
    ap.add_argument("--median-tokens", type=int, default=160, help="median drawn length (lognormal)")
    ap.add_argument("--sigma", type=float, default=1.0, help="spread of the drawn lengths (lognormal)")
    ap.add_argument("--settings", nargs="+", default=be.DEFAULT_SETTINGS, choices=list(be.SETTINGS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-num-seqs", type=int, default=be.RECIPE_MAX_NUM_SEQS)
    ap.add_argument("--seed", type=int, default=0, help="engine seed (no per-request seeds)")
    ap.add_argument("--repeats", type=int, default=1, help="run the settings this many times, interleaved")
    ap.add_argument("--json", type=Path, default=REPO / "results" / "engine.json")
    args = ap.parse_args()

    be.configure_env()
    from testkit.tiny_model import ensure_smollm2

    model = str(ensure_smollm2())
    wl = be.build_workload(
        model,
        be.Workload(
            prompts=args.prompts,
            n=args.n,
            max_tokens=args.max_tokens,
            greedy_prompts=args.greedy_prompts,
            temperature=args.temperature,
            offset=args.offset,
            ignore_eos=args.ignore_eos,
            lengths=args.lengths,
            median_tokens=args.median_tokens,
            sigma=args.sigma,
            seed=args.seed,
        ),
    )
    kw = be.engine_kwargs(wl, dtype=args.dtype, max_num_seqs=args.max_num_seqs, seed=args.seed)
    print(f"[bench] workload {json.dumps(wl.describe())}\n[bench] engine {json.dumps(kw)}", flush=True)
    report = be.run_all(model, wl, args.settings, kw, log=lambda s: print(s, flush=True), repeats=args.repeats)
    report["command"] = " ".join([Path(sys.executable).name] + sys.argv)
    table = be.format_table(report)
    report["table"] = table
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str))
    print()
    print(table)
    print(f"\n[bench] total {report['total_s']} s; JSON: {args.json}")


if __name__ == "__main__":
    main()
