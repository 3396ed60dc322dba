#!/usr/bin/env bash
# Shared body of run_dapo_smollm2_cpu_{sam,baseline}.sh: DAPO on SmolLM2-135M-Instruct on this machine's
# CPU (recipes/dapo_smollm2_cpu). On first use it sets up the verl environment (.venv-verl, a few
# minutes), converts the model (cached, as the demo does) and writes the easy arithmetic data; then it
# composes, checks and launches the recipe like every run_dapo_* script.
#
#   bash scripts/run_cpu_preset.sh sam|baseline [--replicas 1|2] [--dry-run] [--verbose] [overrides ...]
#
# --replicas 2: two rollout replicas (recipes/dapo_smollm2_cpu/dapo_smollm2_cpu_2replicas.yaml), with
# verl's requests routed between them; a Ray head started by hand then needs --num-gpus=2.
#
# Environment: DATA_DIR (default ~/data/dapo), MODEL_PATH (default: the converted SmolLM2 cache),
# SAM_LAUNCHER=ray-job to submit to RAY_ADDRESS, and the rest of scripts/run_recipe.sh.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
case "${1:-}" in
  sam) arm=sam=enabled ;;
  baseline) arm=sam=disabled ;;
  *) echo "usage: $0 sam|baseline [--dry-run] [overrides ...]" >&2; exit 2 ;;
esac
shift
config=dapo_smollm2_cpu
if [ "${1:-}" = "--replicas" ]; then
  case "${2:-}" in
    1) ;;
    2) config=dapo_smollm2_cpu_2replicas ;;
    *) echo "error: --replicas takes 1 or 2, got '${2:-}'" >&2; exit 2 ;;
  esac
  shift 2
fi
bash "$repo/scripts/setup_verl_env.sh"
python="$repo/.venv-verl/bin/python"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${MODEL_PATH:-}" ]; then
  MODEL_PATH="$("$python" -c 'from testkit.tiny_model import ensure_smollm2; print(ensure_smollm2())')"
  export MODEL_PATH
fi
export DATA_DIR="${DATA_DIR:-$HOME/data/dapo}"
export TRAIN_FILE="${TRAIN_FILE:-$DATA_DIR/arithmetic-train.parquet}" TEST_FILE="${TEST_FILE:-$DATA_DIR/arithmetic-val.parquet}"
if [ ! -f "$TRAIN_FILE" ] || [ ! -f "$TEST_FILE" ]; then
  "$python" -m sam_rollout.verl.data.prepare --out "$DATA_DIR" --arithmetic-only
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec bash "$repo/scripts/run_recipe.sh" dapo_smollm2_cpu "$config" "$arm" "$@"
