"""The GPU engine checks of issue 36, one part per call (scripts/device_checks.sh runs them all).

    python scripts/gpu_engine_checks.py {identity,sampled,speed,step_cost} --json OUT.json [--model DIR] [--tiny]

The code is ``benchmarks.gpu_engine_checks``.
"""

from benchmarks.gpu_engine_checks import main

if __name__ == "__main__":
    main()
