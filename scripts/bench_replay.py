"""Replay benchmark entry point: `python scripts/bench_replay.py [--groups N] [--out results/]`.

The benchmark lives in benchmarks/bench_replay.py (also runnable as `python -m benchmarks.bench_replay`).
"""

from benchmarks.bench_replay import main

if __name__ == "__main__":
    main()
