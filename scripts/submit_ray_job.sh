#!/usr/bin/env bash
# Submit a recipe run as a Ray job (returns at once) with the runtime env we ship
# (configs/ray/runtime_env.yaml), then follow it:
#   RAY_ADDRESS=http://HEAD:8265 MODEL_PATH=... bash scripts/submit_ray_job.sh scripts/run_dapo_qwen3_32b_sam.sh [--dry-run] [overrides ...]
#   ray job logs --address "$RAY_ADDRESS" --follow <submission id printed by ray>
#   ray job status --address "$RAY_ADDRESS" <id>;  ray job stop --address "$RAY_ADDRESS" <id>
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
  echo "usage: $0 scripts/run_dapo_<model>_<arm>.sh [--dry-run] [overrides ...]" >&2
  exit 2
fi
script="$1"; shift
SAM_LAUNCHER=ray-job exec bash "$script" "$@"
