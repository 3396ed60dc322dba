"""The main demo: a GRPO-like rollout in a real vLLM engine, SAM off and on, with the rollout's tail.

    python scripts/demo_engine.py [--prompts 8] [--n 4] [--median-tokens 40] [--max-tokens 1024]
                                  [--schedule auto | --threshold 8] [--cycles 1] [--json FILE] [--log FILE]

The code is ``benchmarks.demo_engine``.
"""

from benchmarks.demo_engine import main

if __name__ == "__main__":
    main()
