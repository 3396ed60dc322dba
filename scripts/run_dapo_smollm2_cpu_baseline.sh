#!/usr/bin/env bash
# The A/B baseline of run_dapo_smollm2_cpu_sam.sh: the same run without speculative decoding.
#   bash scripts/run_dapo_smollm2_cpu_baseline.sh [--replicas 1|2] [--dry-run] [--verbose] [overrides ...]
set -euo pipefail
exec bash "$(dirname "$0")/run_cpu_preset.sh" baseline "$@"
