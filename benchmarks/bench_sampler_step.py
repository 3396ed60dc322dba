"""Benchmark: what vLLM's sampling costs in a step without drafts, with speculation configured or not.

Times, side by side in one process and interleaved, the plain ``Sampler`` (an engine without
speculation), vLLM's ``RejectionSampler`` as released (every step of an engine with speculation
configured), and the same with ``sam_rollout.vllm.undrafted_steps``, for a step in which no request has
drafts. All three return the same token (``tests/test_undrafted_steps.py``).

    python -m benchmarks.bench_sampler_step [--batch-sizes 1 8 64] [--vocab 49152] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testkit.vllm_tools import bind_cpu_kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: SmolLM2's, 49152)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dtype", default="float32", help="logits dtype (the engine benchmark and demo run float32)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    bind_cpu_kernels()
    from benchmarks.sampler_step import SMOLLM2_VOCAB, time_undrafted_step
    from sam_rollout.vllm import cpu_drafted_rows, cpu_sampler_fix

    cpu_sampler_fix.install()  # as the plugin does in every vLLM process on a CPU platform
    cpu_drafted_rows.install()
    vocab = args.vocab or SMOLLM2_VOCAB
    rows = []
    print("| sampling | batch | plain ms | released ms | patched ms | released - plain | patched - plain |")
    print("|---|---|---|---|---|---|---|")
    for greedy in (False, True):
        for batch in args.batch_sizes:
            r = time_undrafted_step(batch, vocab=vocab, greedy=greedy, repeats=args.repeats, dtype=args.dtype)
            rows.append(r)
            ms = r["ms"]
            print(
                f"| {'greedy' if greedy else 'T=1.0'} | {batch} | {ms['plain']:.2f} | {ms['released']:.2f} | "
                f"{ms['patched']:.2f} | {r['released_minus_plain_ms']:+.2f} | {r['patched_minus_plain_ms']:+.2f} |",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
