#!/usr/bin/env bash
# The main job: set up the pinned environment (first run: a few minutes), then replay the shared
# traces through every drafter and print acceptance, drafting cost and the targets.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m benchmarks.bench_replay "$@"
