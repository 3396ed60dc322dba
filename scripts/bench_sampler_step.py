"""Benchmark: what vLLM's sampling costs in a step without drafts, with speculation configured or not.

    python scripts/bench_sampler_step.py [--batch-sizes 1 8 64] [--vocab 49152] [--json FILE]

The code is ``benchmarks.bench_sampler_step``.
"""

from benchmarks.bench_sampler_step import main

if __name__ == "__main__":
    main()
