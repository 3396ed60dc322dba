#!/usr/bin/env bash
# Set up the pinned environment (first run: a few minutes) and run the whole test suite, the
# real-engine tests included. SAM_STRICT=1 turns a missing prerequisite into a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
SAM_STRICT=1 exec "${SAM_VENV:-.venv}/bin/python" -m pytest -q "$@"
