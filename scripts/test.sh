#!/usr/bin/env bash
# Set up the pinned environment (first run: a few minutes) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -q "$@"
