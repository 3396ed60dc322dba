"""Trace generation entry point: GRPO-style rollouts of DAPO prompts with vLLM, stored as a trace file.

    python scripts/generate_traces.py --prompts 12 --n 8 --max-tokens 4096 --out results/traces.npz
    python scripts/generate_traces.py --model Qwen/Qwen3-8B --dtype bfloat16 --tp 1 --no-enforce-eager ...

The generator lives in benchmarks/generate_traces.py; the file format in benchmarks/traces.py.
"""

from benchmarks.generate_traces import main

if __name__ == "__main__":
    main()
