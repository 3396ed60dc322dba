#!/usr/bin/env bash
# DAPO Qwen3-235B-A22B, 8 nodes x 16 910C dies (the published setup), baseline: SAM off, everything else identical to run_dapo_qwen3_235b_sam.sh.
#   MODEL_PATH=/models/Qwen3-... bash scripts/run_dapo_qwen3_235b_baseline.sh [--dry-run] [overrides ...]
# e.g. sam.spec.switch=4 sam.num_speculative_tokens=4 ab.seed=7. Environment: see scripts/run_recipe.sh.
set -euo pipefail
exec bash "$(dirname "$0")/run_recipe.sh" dapo_qwen3_235b ${SAM_CONFIG_NAME:-dapo_qwen3_235b} sam=disabled "$@"
