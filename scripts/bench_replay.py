"""Replay benchmark entry point: `python scripts/bench_replay.py [--groups N] [--out results/]`.

The benchmark lives in benchmarks/bench_replay.py (also runnable as `python -m benchmarks.bench_replay`).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_replay import main  # noqa: E402

if __name__ == "__main__":
    main()
