"""Engine benchmark (not part of the tests): one GRPO-like workload under several speculative settings.

    python scripts/bench_engine.py                               # 16 DAPO prompts x n=4, T=1, + 16 greedy, 1024 tok
    python scripts/bench_engine.py --prompts 4 --greedy-prompts 4 --max-tokens 256 --json results/engine-quick.json
    python scripts/bench_engine.py --settings none sam sam_group     # a subset

The code is ``benchmarks.bench_engine``.
"""

from benchmarks.bench_engine import main

if __name__ == "__main__":
    main()
