"""Acceptance-against-context entry point: mean tokens per decode step by response position, per drafter.

    python scripts/acceptance_curves.py                     # shared Qwen2.5-Math traces -> qwen25math
    python scripts/acceptance_curves.py --traces benchmarks/fixtures/smollm2_dapo_T1.0_n8.npz
    python scripts/acceptance_curves.py --revisits          # the revisit proxy (current visits only)

Writes benchmarks/results/acceptance_<name>_k<k>.json (the rollout simulator's acceptance profile) and .png.
The computation lives in benchmarks/acceptance_curves.py.
"""

from benchmarks.acceptance_curves import main

if __name__ == "__main__":
    main()
