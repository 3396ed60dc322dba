"""Which SAM route the installed vLLM offers and, given a model, whether SAM on it decodes greedily exactly
as the engine without speculation (device_checks.sh's vLLM part).

    python scripts/check_vllm_route.py --json OUT.json                  # route only (no engine)
    python scripts/check_vllm_route.py --json OUT.json --model PATH     # plus a greedy identity run

The code is ``testkit.check_vllm_route``.
"""

from testkit.check_vllm_route import main

if __name__ == "__main__":
    main()
