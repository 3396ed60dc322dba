"""Benchmark: vectorised rejection sampler against plain-loop implementations, on CPU or a GPU.

    python scripts/bench_rejection.py [--device cpu|cuda] [--json results/bench_rejection.json]

The code is ``benchmarks.bench_rejection``.
"""

from benchmarks.bench_rejection import main

if __name__ == "__main__":
    main()
