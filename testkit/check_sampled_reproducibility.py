"""Is a sampled run reproducible from the engine seed? Each setting twice, same everything.

    python -m testkit.check_sampled_reproducibility [--settings none ngram sam] [--runs 2]

Runs the engine benchmark's workload (DAPO prompts in the chat template, n samples each, T=1.0,
engine seed only) through a fresh engine per run with the settings of `testkit/engine.py`, and
prints a hash and the token count of every run's outputs. Identical hashes within a setting mean
that the setting reproduces its samples; a difference that also shows without speculation is the
engine's, not the drafter's.
"""

from __future__ import annotations

import argparse
import hashlib
import json

from testkit import engine as bench


def run_once(model_dir: str, wl: bench.Workload, setting: str, seed: int) -> tuple[str, int]:
    from vllm import LLM, SamplingParams

    from testkit.vllm_tools import shutdown

    spec, extra, _ = bench.SETTINGS[setting]
    kwargs = bench.engine_kwargs(wl, seed=seed)
    if spec is not None:
        kwargs["speculative_config"] = spec
    if extra is not None:
        kwargs["additional_config"] = extra
    llm = LLM(model_dir, **kwargs)
    try:
        params = SamplingParams(n=wl.n, temperature=wl.temperature, max_tokens=wl.max_tokens)
        outputs = llm.generate([{"prompt_token_ids": p} for p in wl.prompt_token_ids], params, use_tqdm=False)
    finally:
        shutdown(llm)
    tokens = [list(c.token_ids) for o in outputs for c in o.outputs]
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16], sum(map(len, tokens))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=["none", "ngram", "sam"], choices=sorted(bench.SETTINGS))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    bench.configure_env()
    from testkit.tiny_model import ensure_smollm2

    model_dir = str(ensure_smollm2())
    wl = bench.build_workload(
        model_dir, bench.Workload(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, greedy_prompts=0)
    )
    results = {s: [run_once(model_dir, wl, s, args.seed) for _ in range(args.runs)] for s in args.settings}
    print(f"{args.prompts} prompts x n={args.n}, T={wl.temperature}, {args.max_tokens} tokens, engine seed {args.seed}")
    for setting, runs in results.items():
        same = len({h for h, _ in runs}) == 1
        print(
            f"{setting:10s} "
            + "  ".join(f"{h} ({n} tokens)" for h, n in runs)
            + ("  reproducible" if same else "  DIFFERENT")
        )


if __name__ == "__main__":
    main()
