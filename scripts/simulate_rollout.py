"""Simulate synchronous RL rollout steps with SAM off and on (benchmarks/simulator.py).

    .venv/bin/python scripts/simulate_rollout.py            # about a minute; writes JSON + PNG
    .venv/bin/python scripts/simulate_rollout.py --cluster  # R replicas x routing x epoch (below)

The code is ``benchmarks.simulate_rollout``.
"""

from benchmarks.simulate_rollout import main

if __name__ == "__main__":
    main()
