"""Which dtypes are bit-exact between the decode path and the verify path? (testkit/precision.py)

python -m testkit.precision_check [--dtypes float32 bfloat16] [--prompts 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from testkit.data import load_dapo_prompts
    from testkit.precision import check_dtype
    from testkit.tiny_model import ensure_smollm2
    from testkit.vllm_tools import chat_prompt_ids

    model = str(ensure_smollm2())
    prompts = chat_prompt_ids(AutoTokenizer.from_pretrained(model), load_dapo_prompts(args.prompts))
    rows = []
    for dtype in args.dtypes:
        print(f"[{dtype}] decode, prefill and verify paths ...", flush=True)
        rows += [c.as_dict() for c in check_dtype(model, prompts, dtype, args.max_tokens)]
    print(f"\n{'dtype':<10}{'path':<20}{'max |dlogprob|':>16}{'tokens':>8}  first divergence   bit-exact")
    for r in rows:
        first = (
            "none"
            if r["first_divergence"] is None
            else f"prompt {r['first_divergence'][0]}, token {r['first_divergence'][1]}"
        )
        print(
            f"{r['dtype']:<10}{r['path']:<20}{r['max_logprob_diff']:>16.3g}{r['tokens_compared']:>8}  "
            f"{first:<18} {'yes' if r['bit_exact'] else 'no'}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
